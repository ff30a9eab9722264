"""RocketMQ tag expressions, read in one place: ``*`` (or empty) matches every message;
``A || B`` matches a message whose tag is A or B, and an untagged message only ``*``.
The broker's pop and pull filters (``broker/pop.py`` ``TagFilter``) and the
PullConsumer's Flight reads (``client/consumer.py``) both read expressions here: a
top-level module, as the client may import neither the broker nor the log."""
from __future__ import annotations

from .errors import FilterExpressionError


def tag_set(expression: str | None) -> frozenset[str] | None:
    """The tags ``expression`` matches; None when it matches every message.
    FilterExpressionError for an expression with an empty tag (``A || ``)."""
    expr = (expression or "").strip()
    if not expr or expr == "*":
        return None
    tags = frozenset(t.strip() for t in expr.split("||"))
    if "" in tags:
        raise FilterExpressionError(f"tag expression {expression!r} has an empty tag")
    return tags
