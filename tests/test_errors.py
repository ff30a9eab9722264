"""The error hierarchy (sparkmq/errors.py), the OSError boundary (StoreFS) and the
rule that no ``except Exception`` hides a bug. Fast tier: no servers, no Spark."""
from __future__ import annotations

import ast
import builtins
import errno
import inspect
import os
import pathlib
import re
import types

import pytest

from sparkmq import Message, Store, errors
from sparkmq.log import segment as seg
from sparkmq.log.fs import StoreFS

PACKAGE = pathlib.Path(errors.__file__).parent


def _error_classes() -> list[type]:
    return [c for _, c in inspect.getmembers(errors, inspect.isclass)
            if c.__module__ == errors.__name__]


def test_every_error_derives_from_the_root_with_a_docstring_and_a_unique_code():
    classes = _error_classes()
    assert len(classes) > 20
    codes: dict[str, type] = {}
    for cls in classes:
        assert issubclass(cls, errors.SparkMQError), cls
        assert (cls.__doc__ or "").strip(), f"{cls.__name__} has no docstring"
        assert "code" in vars(cls), f"{cls.__name__} inherits its code"
        assert re.fullmatch(r"SPARKMQ_[A-Z_]+", cls.code), cls.code
        assert cls.code not in codes, f"{cls.__name__} reuses {codes.get(cls.code)}'s code"
        codes[cls.code] = cls


def test_the_code_is_in_the_text():
    e = errors.StoreIOError("disk full", errno=errno.ENOSPC, path="commitlog/x")
    assert str(e).startswith("[SPARKMQ_STORE_IO] ") and e.message == "disk full"
    assert isinstance(e, errors.StoreError) and e.errno == errno.ENOSPC


def test_old_import_locations_still_work():
    from sparkmq.broker.filter import FilterExpressionError
    from sparkmq.broker.pop import InvalidHandle
    from sparkmq.broker.protocol import ClientIdRequired, IllegalOffset
    from sparkmq.broker.schedule import DelayRefused
    from sparkmq.broker.transaction import UnknownTransaction
    from sparkmq.client import BrokerUnavailableError, ClientError
    assert FilterExpressionError is errors.FilterExpressionError
    assert issubclass(FilterExpressionError, ValueError)
    assert InvalidHandle is errors.InvalidReceiptHandleError
    assert ClientIdRequired is errors.ClientIdRequiredError
    assert IllegalOffset is errors.IllegalOffsetError
    assert DelayRefused is errors.DelayRefused
    assert UnknownTransaction is errors.UnknownTransaction
    assert ClientError is errors.ClientError
    assert BrokerUnavailableError is errors.BrokerUnavailableError


def _classes_outside_errors():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "errors.py" and path.parent == PACKAGE:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                yield path.relative_to(PACKAGE.parent), node


_BUILTIN_EXCEPTIONS = {n for n, v in vars(builtins).items()
                       if isinstance(v, type) and issubclass(v, BaseException)}


def _base_names(node: ast.ClassDef) -> set[str]:
    out = set()
    for b in node.bases:
        if isinstance(b, ast.Name):
            out.add(b.id)
        elif isinstance(b, ast.Attribute):
            out.add(b.attr)
    return out


def test_no_public_exception_class_outside_errors_py():
    error_names = {c.__name__ for c in _error_classes()}
    bad = []
    for path, node in _classes_outside_errors():
        bases = _base_names(node)
        if not bases & (_BUILTIN_EXCEPTIONS | error_names):
            continue
        private_ok = node.name.startswith("_") and bases & error_names
        if not private_ok:
            bad.append(f"{path}:{node.lineno} {node.name}({', '.join(sorted(bases))})")
    assert not bad, "exception classes outside sparkmq/errors.py:\n" + "\n".join(bad)


def test_every_except_exception_says_why():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.search(r"\bexcept\s*(\(\s*)?Exception\b", line) \
                    or re.fullmatch(r"\s*except\s*:\s*(#.*)?", line):
                above = lines[i - 1].strip() if i else ""
                if "#" not in line and not above.startswith("#"):
                    bad.append(f"{path.relative_to(PACKAGE.parent)}:{i + 1}: {line.strip()}")
    assert not bad, "`except Exception` without a comment saying why:\n" + "\n".join(bad)


# --- the OSError boundary ----------------------------------------------------

def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_storefs_turns_oserror_into_a_store_error_naming_the_path(monkeypatch):
    sfs = StoreFS("memory://errors-fs-" + os.urandom(4).hex())
    monkeypatch.setattr(sfs.fs, "pipe_file", _enospc)
    with pytest.raises(errors.StoreIOError) as info:
        sfs.write("tables/x.parquet", b"abc")
    e = info.value
    assert e.errno == errno.ENOSPC and e.path == "tables/x.parquet" and e.operation == "write"
    assert "tables/x.parquet" in str(e) and "ENOSPC" in str(e) and "free space" in str(e)


def test_missing_files_and_lost_races_keep_their_meaning(tmp_path):
    sfs = StoreFS(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        sfs.read_bytes("nope")
    assert sfs.put_if_absent("a", b"1") is True
    assert sfs.put_if_absent("a", b"2") is False
    sfs.delete("nope")                       # deleting a missing file is not an error


def test_an_enospc_on_a_memory_store_reaches_the_caller_of_append(monkeypatch):
    store = Store.open("memory://errors-append-" + os.urandom(4).hex(), start_services=False)
    try:
        store.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        monkeypatch.setattr(store.sfs.fs, "pipe_file", _enospc)
        with pytest.raises(errors.StoreIOError, match="commitlog") as info:
            store.append([Message(topic="t", body=b"x", queue_id=0)])
            store.commitlog.flush(sync=True)
        assert info.value.errno == errno.ENOSPC
    finally:
        monkeypatch.undo()
        store.close()


def test_an_enospc_on_a_local_segment_reaches_the_caller_of_append(tmp_path, monkeypatch):
    store = Store.open(str(tmp_path / "s"), start_services=False)
    try:
        store.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        fake_os = types.SimpleNamespace(**{n: getattr(os, n) for n in dir(os)
                                           if not n.startswith("__")})
        fake_os.write = _enospc
        monkeypatch.setattr(seg, "os", fake_os)
        with pytest.raises(errors.StoreIOError, match="ENOSPC") as info:
            store.append([Message(topic="t", body=b"x", queue_id=0)])
        assert info.value.path.startswith("commitlog")
        assert info.value.path in str(info.value)
    finally:
        monkeypatch.undo()
        store.close()


@pytest.mark.parametrize("fail", ["fsync", "replace"])
def test_a_failed_atomic_write_leaves_no_temporary_file(tmp_path, monkeypatch, fail):
    """A commit file or ``_last_checkpoint`` is written to a ``.tmp-*`` file first; a
    full disk at its fsync (or a failed rename) refuses the write and takes the temporary
    file with it: nothing under ``_log`` lists it afterwards."""
    from sparkmq.log import fs as fsmod
    sfs = StoreFS(str(tmp_path))
    sfs.put_if_absent("_log/a", b"kept")
    fake_os = types.SimpleNamespace(**{n: getattr(os, n) for n in dir(os)
                                       if not n.startswith("__")})
    setattr(fake_os, fail, _enospc)
    monkeypatch.setattr(fsmod, "os", fake_os)
    with pytest.raises(errors.StoreIOError, match="ENOSPC"):
        sfs.replace("_log/b", b"new")
    if fail == "fsync":
        with pytest.raises(errors.StoreIOError, match="ENOSPC"):
            sfs.put_if_absent("_log/c", b"new")
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path / "_log")) == ["a"]
    assert sfs.read_bytes("_log/a") == b"kept"
