"""Compatibility names: the gRPC front-end moved to ``grpc_service.py``, the send model
``SendRows`` to ``send.py``, the protocol conversions to ``protocol.py``."""
from __future__ import annotations

from .grpc_service import MessagingServicer, add_to_server  # noqa: F401
from .protocol import error_status, recover_command, status  # noqa: F401
from .send import SendRows  # noqa: F401

__all__ = ["MessagingServicer", "add_to_server", "SendRows", "recover_command", "status",
           "error_status"]
