"""The machinery of typed transaction-log actions (see ``actions``): the frozen
base classes, their JSON round trip, and the read-only views they hold. Kept apart
so that action types defined in other modules (``auth_actions``) build on it
without an import cycle.

Thread-safety: values are immutable; the functions are pure.
"""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any, ClassVar, Mapping

from ..errors import CorruptStoreError

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _frozen(d: Mapping | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(d)) if d else _EMPTY


class JsonView:
    """Read-only access to a public config by its JSON names (``conf["readQueueNums"]``,
    ``.get``, ``in``), answering what the JSON of FORMAT.md answers (absent optional
    fields are missing). For users of the public API who read configs as the JSON
    dicts earlier versions returned; code inside sparkmq uses attributes
    (tests/test_layering.py checks)."""

    def _json_attr(self, key: str):
        names = type(self).__dict__.get("_json_names")
        if names is None:
            names = {k: a for a, k in self.FIELDS.items()}    # type: ignore[attr-defined]
            type(self)._json_names = names
        attr = names.get(key)
        if attr is None:
            if key in self.extra:                              # type: ignore[attr-defined]
                return _to_json_value(self.extra[key])         # type: ignore[attr-defined]
            raise KeyError(key)
        v = getattr(self, attr)
        if v is None and attr in self.OPTIONAL:                # type: ignore[attr-defined]
            raise KeyError(key)
        return _to_json_value(v)

    def __getitem__(self, key: str):
        return self._json_attr(key)

    def get(self, key: str, default=None):
        try:
            return self._json_attr(key)
        except KeyError:
            return default

    def __contains__(self, key: str) -> bool:
        try:
            self._json_attr(key)
            return True
        except KeyError:
            return False


class _Action:
    """Base of every action: ``KIND`` is its JSON key; ``FIELDS`` maps the
    attribute names to JSON names, in the order they are declared; attributes in
    ``OPTIONAL`` are left out of the JSON when None."""

    KIND: ClassVar[str] = ""
    FIELDS: ClassVar[dict[str, str]] = {}
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    def body(self) -> dict:
        """The action's JSON body (without the action-type key)."""
        out = dict(self.extra)    # type: ignore[attr-defined]
        for attr, key in self.FIELDS.items():
            v = getattr(self, attr)
            if v is None and attr in self.OPTIONAL:
                continue
            out[key] = _to_json_value(v)
        return out

    def to_json(self) -> dict:
        return {self.KIND: self.body()}

    def __reduce__(self):
        # (mapping fields are read-only proxies, which do not pickle): rebuild from JSON
        return type(self).from_body, (self.body(),)

    @classmethod
    def from_body(cls, body: Mapping) -> "_Action":
        plan = cls.__dict__.get("_plan") or _plan(cls)
        kwargs = {}
        for attr, key, required, nested in plan:
            v = body.get(key, _MISSING)
            if v is _MISSING:
                if required:
                    raise CorruptStoreError(f"{cls.KIND} action lacks {key!r}: {dict(body)}")
                continue
            if nested is not None:
                v = tuple(nested.from_json(x) for x in v)
            elif type(v) is dict:
                v = _frozen(v)
            elif type(v) is list:
                v = tuple(v)
            kwargs[attr] = v
        if len(body) > len(kwargs):
            known = cls.__dict__["_known"]
            extra = {k: v for k, v in body.items() if k not in known}
            if extra:
                kwargs["extra"] = _frozen(extra)
        obj = _built(cls, {**cls.__dict__["_defaults"], **kwargs})
        if hasattr(cls, "__post_init__"):
            obj.__post_init__()
        return obj


_MISSING = object()


def _plan(cls) -> tuple:
    """(attribute, JSON key, required, nested struct type) per field of ``cls``, cached."""
    nested = getattr(cls, "NESTED", {})
    plan = tuple((attr, key, attr not in cls.OPTIONAL and not _has_default(cls, attr),
                  nested.get(attr)) for attr, key in cls.FIELDS.items())
    cls._plan = plan
    cls._known = frozenset(cls.FIELDS.values())
    cls._defaults = {f.name: f.default if f.default is not dataclasses.MISSING
                     else f.default_factory()
                     for f in dataclasses.fields(cls)
                     if f.default is not dataclasses.MISSING
                     or f.default_factory is not dataclasses.MISSING}
    return plan


def _built(cls, values: dict):
    """An instance of the frozen dataclass ``cls`` holding ``values`` (every field),
    made without the frozen ``__init__`` and its per-field ``object.__setattr__``:
    replay builds one value per action and one per queue of every ConsumeQueue add,
    and this halves the cost of loading a snapshot. The values are checked by the
    caller (required fields present; defaults filled in)."""
    obj = object.__new__(cls)
    obj.__dict__.update(values)
    return obj


def _has_default(cls, attr: str) -> bool:
    f = cls.__dataclass_fields__[attr]
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _to_json_value(v):
    if isinstance(v, Mapping):
        return {k: _to_json_value(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return [_to_json_value(x) for x in v]
    if isinstance(v, _Struct):
        return v.to_json()
    return v


class _Struct:
    """A nested JSON object inside an action (a queue's stats, a queue floor)."""

    FIELDS: ClassVar[dict[str, str]] = {}
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    def to_json(self) -> dict:
        out = dict(self.extra)    # type: ignore[attr-defined]
        for attr, key in self.FIELDS.items():
            v = getattr(self, attr)
            if v is None and attr in self.OPTIONAL:
                continue
            out[key] = v
        return out

    def __reduce__(self):
        return type(self).from_json, (self.to_json(),)

    @classmethod
    def from_json(cls, body: Mapping):
        if len(body) == len(cls.FIELDS):    # the common case: every field, nothing else
            try:
                values = dict(zip(cls.FIELDS, map(body.__getitem__, cls.FIELDS.values())))
            except KeyError:
                pass
            else:
                values["extra"] = _EMPTY
                return _built(cls, values)
        known = set(cls.FIELDS.values())
        kwargs = {attr: body[key] for attr, key in cls.FIELDS.items() if key in body}
        missing = [key for attr, key in cls.FIELDS.items()
                   if key not in body and attr not in cls.OPTIONAL]
        if missing:
            raise CorruptStoreError(f"{cls.__name__} lacks {missing}: {dict(body)}")
        return cls(**kwargs, extra=_frozen({k: v for k, v in body.items() if k not in known}))


