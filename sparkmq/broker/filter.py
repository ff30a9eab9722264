"""SQL92 property filters (RocketMQ's ``ExpressionType.SQL92`` subset), evaluated at the broker.

Contract:
- ``SqlFilter(expression)`` parses once (tokenizer + recursive descent) and raises
  ``FilterExpressionError`` (a ``UserError`` and a ``ValueError``) naming the position and what
  was expected; a parsed filter is immutable and thread-safe.
- ``SqlFilter.accepts(message)`` / ``evaluate(properties)`` decide a message from its user
  properties plus ``TAGS`` (the message tag). A message passes only if the expression is TRUE.
- Grammar (keywords case-insensitive)::

      expr      := and_expr (OR and_expr)*
      and_expr  := not_expr (AND not_expr)*
      not_expr  := NOT not_expr | primary
      primary   := '(' expr ')' | TRUE | FALSE | operand [predicate]
      predicate := cmp operand | [NOT] IN '(' literal (',' literal)* ')'
                 | [NOT] BETWEEN operand AND operand | IS [NOT] NULL
                 | [NOT] (CONTAINS | STARTSWITH | ENDSWITH) operand
      cmp       := '=' | '<>' | '!=' | '<' | '<=' | '>' | '>='
      operand   := identifier | number | 'string' ('' escapes a quote) | TRUE | FALSE | NULL

- Semantics are SQL's three-valued logic: a comparison with a missing property (NULL) is
  UNKNOWN, ``NOT UNKNOWN`` is UNKNOWN, and UNKNOWN does not pass. Property values are strings;
  compared with a number they are parsed as one (a value that is not a number makes the
  comparison UNKNOWN, as RocketMQ evaluates it false); compared with a string they compare
  as strings (``<``/``>`` lexicographically); compared with TRUE/FALSE, ``'true'``/``'false'``
  (any case) are booleans.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from ..errors import FilterExpressionError

__all__ = ["FilterExpressionError", "SqlFilter", "TAGS_PROPERTY"]

TAGS_PROPERTY = "TAGS"
MAX_EXPRESSION_CHARS = 64 * 1024

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?[lLdDfF]?)
  | (?P<str>'(?:[^']|'')*')
  | (?P<op><>|!=|<=|>=|=|<|>|\(|\)|,)
  | (?P<ident>[A-Za-z_$][A-Za-z0-9_.$\-]*)
""", re.VERBOSE)

_KEYWORDS = {"AND", "OR", "NOT", "IN", "BETWEEN", "IS", "NULL", "TRUE", "FALSE",
             "CONTAINS", "STARTSWITH", "ENDSWITH"}
_CMP = {"=", "<>", "!=", "<", "<=", ">", ">="}

Value = Any                      # str | int | float | bool | None (NULL / UNKNOWN)
Node = Callable[[Mapping[str, str]], Value]


class _Tok:
    __slots__ = ("kind", "text", "pos", "value")

    def __init__(self, kind: str, text: str, pos: int, value: Any = None):
        self.kind, self.text, self.pos, self.value = kind, text, pos, value

    def is_kw(self, *words: str) -> bool:
        return self.kind == "kw" and self.text in words


def _number(text: str) -> int | float:
    t = text.rstrip("lLdDfF")
    if re.fullmatch(r"[-+]?\d+", t):
        return int(t)
    return float(t)


def tokenize(expression: str) -> list[_Tok]:
    """Tokens of ``expression`` ending with an ``eof`` token; FilterExpressionError if a
    character starts no token."""
    out: list[_Tok] = []
    pos = 0
    while pos < len(expression):
        m = _TOKEN.match(expression, pos)
        if m is None:
            raise FilterExpressionError(
                f"SQL filter {expression!r}: unexpected character {expression[pos]!r} at {pos}"
                + (" (unterminated string?)" if expression[pos] == "'" else ""))
        kind, text = m.lastgroup, m.group()
        if kind == "num":
            out.append(_Tok("lit", text, pos, _number(text)))
        elif kind == "str":
            out.append(_Tok("lit", text, pos, text[1:-1].replace("''", "'")))
        elif kind == "op":
            out.append(_Tok("op", text, pos))
        elif kind == "ident":
            up = text.upper()
            out.append(_Tok("kw", up, pos) if up in _KEYWORDS else _Tok("ident", text, pos))
        pos = m.end()
    out.append(_Tok("eof", "", pos))
    return out


# ---------------------------------------------------------------- value semantics
def _as_bool(v: Value) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    return None


def _as_num(v: Value) -> int | float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return v
    try:
        return _number(v.strip())
    except (ValueError, AttributeError):
        return None


def _coerce(a: Value, b: Value) -> tuple[Value, Value] | None:
    """Both sides in one comparable domain, or None (UNKNOWN) if there is none."""
    if a is None or b is None:
        return None
    if isinstance(a, bool) or isinstance(b, bool):
        x, y = _as_bool(a), _as_bool(b)
        return None if x is None or y is None else (x, y)
    if isinstance(a, str) and isinstance(b, str):
        return a, b
    x, y = _as_num(a), _as_num(b)
    return None if x is None or y is None else (x, y)


_ORDERED = {
    "=": lambda x, y: x == y, "<>": lambda x, y: x != y, "!=": lambda x, y: x != y,
    "<": lambda x, y: x < y, "<=": lambda x, y: x <= y,
    ">": lambda x, y: x > y, ">=": lambda x, y: x >= y,
}


def _compare(op: str, a: Value, b: Value) -> bool | None:
    pair = _coerce(a, b)
    if pair is None:
        return None
    x, y = pair
    if isinstance(x, bool) and op not in ("=", "<>", "!="):
        return None
    return _ORDERED[op](x, y)


def _not(v: bool | None) -> bool | None:
    return None if v is None else not v


# ---------------------------------------------------------------- parser
class _Parser:
    def __init__(self, expression: str):
        self.src = expression
        self.toks = tokenize(expression)
        self.i = 0

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def fail(self, expected: str) -> FilterExpressionError:
        t = self.tok
        found = "end of expression" if t.kind == "eof" else repr(t.text)
        return FilterExpressionError(
            f"SQL filter {self.src!r}: expected {expected} at position {t.pos}, found {found}")

    def expect_op(self, text: str) -> None:
        if not (self.tok.kind == "op" and self.tok.text == text):
            raise self.fail(repr(text))
        self.i += 1

    def parse(self) -> Node:
        node = self.expr()
        if self.tok.kind != "eof":
            raise self.fail("AND, OR or end of expression")
        return node

    def expr(self) -> Node:
        parts = [self.and_expr()]
        while self.tok.is_kw("OR"):
            self.i += 1
            parts.append(self.and_expr())
        return parts[0] if len(parts) == 1 else _or(parts)

    def and_expr(self) -> Node:
        parts = [self.not_expr()]
        while self.tok.is_kw("AND"):
            self.i += 1
            parts.append(self.not_expr())
        return parts[0] if len(parts) == 1 else _and(parts)

    def not_expr(self) -> Node:
        if self.tok.is_kw("NOT"):
            self.i += 1
            inner = self.not_expr()
            return lambda p: _not(inner(p))
        return self.primary()

    def primary(self) -> Node:
        t = self.tok
        if t.kind == "op" and t.text == "(":
            self.i += 1
            node = self.expr()
            self.expect_op(")")
            return node
        if t.is_kw("TRUE", "FALSE") and not self._predicate_follows(1):
            self.i += 1
            value = t.text == "TRUE"
            return lambda p: value
        left = self.operand()
        return self.predicate(left)

    def _predicate_follows(self, ahead: int) -> bool:
        nxt = self.toks[min(self.i + ahead, len(self.toks) - 1)]
        return (nxt.kind == "op" and nxt.text in _CMP) or nxt.is_kw(
            "IN", "BETWEEN", "IS", "NOT", "CONTAINS", "STARTSWITH", "ENDSWITH")

    def operand(self) -> Node:
        t = self.tok
        if t.kind == "ident":
            self.i += 1
            name = t.text
            return lambda p: p.get(name)
        if t.kind == "lit":
            self.i += 1
            v = t.value
            return lambda p: v
        if t.is_kw("TRUE", "FALSE"):
            self.i += 1
            b = t.text == "TRUE"
            return lambda p: b
        if t.is_kw("NULL"):
            self.i += 1
            return lambda p: None
        raise self.fail("a property name or a literal")

    def literal(self) -> Value:
        t = self.tok
        if t.kind == "lit":
            self.i += 1
            return t.value
        if t.is_kw("TRUE", "FALSE"):
            self.i += 1
            return t.text == "TRUE"
        raise self.fail("a literal")

    def predicate(self, left: Node) -> Node:
        t = self.tok
        if t.kind == "op" and t.text in _CMP:
            self.i += 1
            right = self.operand()
            op = t.text
            return lambda p: _compare(op, left(p), right(p))
        if t.is_kw("IS"):
            self.i += 1
            negate = self.tok.is_kw("NOT")
            self.i += negate
            if not self.tok.is_kw("NULL"):
                raise self.fail("NULL")
            self.i += 1
            return (lambda p: left(p) is not None) if negate else (lambda p: left(p) is None)
        negate = t.is_kw("NOT")
        if negate:
            self.i += 1
        node = self._set_or_string_predicate(left)
        return (lambda p: _not(node(p))) if negate else node

    def _set_or_string_predicate(self, left: Node) -> Node:
        t = self.tok
        if t.is_kw("IN"):
            self.i += 1
            self.expect_op("(")
            values = [self.literal()]
            while self.tok.kind == "op" and self.tok.text == ",":
                self.i += 1
                values.append(self.literal())
            self.expect_op(")")
            return lambda p: _in(left(p), values)
        if t.is_kw("BETWEEN"):
            self.i += 1
            lo = self.operand()
            if not self.tok.is_kw("AND"):
                raise self.fail("AND (of BETWEEN)")
            self.i += 1
            hi = self.operand()
            return lambda p: _and_values(_compare(">=", left(p), lo(p)),
                                         _compare("<=", left(p), hi(p)))
        if t.is_kw("CONTAINS", "STARTSWITH", "ENDSWITH"):
            self.i += 1
            right = self.operand()
            fn = {"CONTAINS": str.__contains__, "STARTSWITH": str.startswith,
                  "ENDSWITH": str.endswith}[t.text]
            return lambda p: _string_test(fn, left(p), right(p))
        raise self.fail("a comparison, IN, BETWEEN, IS [NOT] NULL, CONTAINS, STARTSWITH or "
                        "ENDSWITH")


def _string_test(fn, a: Value, b: Value) -> bool | None:
    if not isinstance(a, str) or not isinstance(b, str):
        return None
    return fn(a, b)


def _in(v: Value, values: list) -> bool | None:
    """``v IN (a, b)`` is ``v = a OR v = b`` (three-valued)."""
    if v is None:
        return None
    results = [_compare("=", v, lit) for lit in values]
    if any(r is True for r in results):
        return True
    return None if any(r is None for r in results) else False


def _and_values(*vals: bool | None) -> bool | None:
    if any(v is False for v in vals):
        return False
    return None if any(v is None for v in vals) else True


def _and(parts: list[Node]) -> Node:
    def node(p):
        unknown = False
        for part in parts:
            v = part(p)
            if v is False:
                return False
            if v is not True:
                unknown = True
        return None if unknown else True
    return node


def _or(parts: list[Node]) -> Node:
    def node(p):
        unknown = False
        for part in parts:
            v = part(p)
            if v is True:
                return True
            if v is not False:
                unknown = True
        return None if unknown else False
    return node


class SqlFilter:
    """A parsed SQL92 filter (see module docstring). Thread-safe; immutable."""

    def __init__(self, expression: str | None):
        expr = (expression or "").strip()
        if not expr:
            raise FilterExpressionError("SQL filter expression is empty; use TRUE to match all")
        if len(expr) > MAX_EXPRESSION_CHARS:
            raise FilterExpressionError(
                f"SQL filter expression is {len(expr)} chars; at most {MAX_EXPRESSION_CHARS}")
        self.expression = expr
        try:
            self._root = _Parser(expr).parse()
        except RecursionError:
            raise FilterExpressionError(
                f"SQL filter {expr[:80]!r}...: nested too deeply") from None

    #: an expression may refuse any message (``TRUE`` too is decided message by message)
    accepts_all = False

    def evaluate(self, properties: Mapping[str, str]) -> bool:
        """True only if the expression is TRUE for these properties (UNKNOWN -> False)."""
        return self._root(properties) is True

    def accepts(self, message) -> bool:
        """Decide a StoredMessage: its user properties plus ``TAGS``."""
        props = message.properties or {}
        if message.tags is not None and TAGS_PROPERTY not in props:
            props = {**props, TAGS_PROPERTY: message.tags}
        return self.evaluate(props)

    def matches(self, tag: str | None) -> bool:
        """Tag-only view (used where only a tag is known): evaluates with ``TAGS`` alone."""
        return self.evaluate({} if tag is None else {TAGS_PROPERTY: tag})

    def __repr__(self) -> str:
        return f"SqlFilter({self.expression!r})"
