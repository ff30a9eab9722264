"""PEP 562 lazy public names for a package's ``__init__``: ``__getattr__`` imports a
name's module on first use and caches the value in the package's namespace."""
from __future__ import annotations

from importlib import import_module
from typing import Callable


def lazy_names(package: str, namespace: dict, lazy: dict[str, str],
               public: list[str]) -> tuple[Callable, Callable]:
    """The ``(__getattr__, __dir__)`` pair for ``package``: ``lazy`` maps a name to
    the (relative) module that defines it; ``namespace`` is the package's globals()."""
    def __getattr__(name: str):
        module = lazy.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(public))
    return __getattr__, __dir__
