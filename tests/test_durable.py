"""What a power cut leaves of files written through ``sparkmq.durable`` (a modelled power
cut, ``helpers.powercut``: only what was fsynced stays): a replaced file whole, old or
new; a file created once, whole (a secret: else a new secret at the next start locks out
every client and peer that holds the old one; a TLS key and certificate)."""
from __future__ import annotations

import errno
import os
import ssl
import stat
import types

import pytest

from helpers.powercut import PowerCut
from sparkmq import durable
from sparkmq.durable import create_durably, replace_durably
from sparkmq.secretfile import load_or_create
from sparkmq.tls import make_self_signed


def _cut(root, write) -> None:
    """Run ``write``, then cut the power and leave ``root`` as the cut would."""
    cut = PowerCut()
    try:
        write()
        image = cut.image(str(root))
    finally:
        cut.remove()
    PowerCut.restore(str(root), image)


def test_a_replaced_file_holds_its_new_content_after_a_power_cut(tmp_path):
    path = tmp_path / "kv.json"
    _cut(tmp_path, lambda: replace_durably(str(path), b"first"))
    assert path.read_bytes() == b"first"
    _cut(tmp_path, lambda: replace_durably(str(path), b"second"))
    assert path.read_bytes() == b"second"
    assert os.listdir(tmp_path) == ["kv.json"]            # no temporary file left


def test_a_secret_file_made_once_outlives_a_power_cut(tmp_path):
    path = tmp_path / "conf" / "admin.token"
    made = {}
    _cut(tmp_path, lambda: made.update(secret=load_or_create(str(path))))
    secret, created = made["secret"]
    assert created
    assert load_or_create(str(path)) == (secret, False)


def test_a_file_created_durably_is_whole_after_a_power_cut_and_never_replaced(tmp_path):
    path = tmp_path / "once.bin"
    _cut(tmp_path, lambda: create_durably(str(path), b"x" * 10_000, mode=0o600))
    assert path.read_bytes() == b"x" * 10_000
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError) as e:
        create_durably(str(path), b"other")
    assert e.value.filename == str(path)                   # the name asked for, not the temp
    assert path.read_bytes() == b"x" * 10_000
    assert os.listdir(tmp_path) == ["once.bin"]            # no temporary file left


def test_a_self_signed_pair_outlives_a_power_cut(tmp_path):
    """`sparkmq tls selfsigned` wrote with plain writes: a power cut right after could
    leave an empty key file, which then fails every TLS start, and the command refuses
    to overwrite it."""
    made = {}
    _cut(tmp_path, lambda: made.update(pair=make_self_signed(str(tmp_path / "tls"),
                                                              ["127.0.0.1"])))
    cert, key = made["pair"]
    ssl.create_default_context().load_cert_chain(cert, key)      # both whole and a pair
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert sorted(os.listdir(tmp_path / "tls")) == ["tls.crt", "tls.key"]


def test_a_create_that_fills_the_disk_leaves_neither_the_file_nor_its_temp(tmp_path,
                                                                          monkeypatch):
    path = tmp_path / "once.bin"
    writes = []

    def half_then_full(fd, data):          # a disk filling up: part written, then ENOSPC
        if writes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        writes.append(len(data))
        return real_write(fd, bytes(data[:len(data) // 2]))
    real_write = os.write
    failing = types.SimpleNamespace(**{n: getattr(os, n) for n in dir(os)
                                       if not n.startswith("__")})
    failing.write = half_then_full                # (``os`` as sparkmq.durable sees it)
    monkeypatch.setattr(durable, "os", failing)
    with pytest.raises(OSError) as e:
        create_durably(str(path), b"x" * 10_000)
    assert e.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []              # nothing half-written under any name
    create_durably(str(path), b"x" * 10_000)       # and room again: made whole
    assert path.read_bytes() == b"x" * 10_000
