"""What a power cut leaves of files written through ``sparkmq.durable`` (a modelled power
cut, ``helpers.powercut``: only what was fsynced stays): a replaced file whole, old or
new; a secret file made once (else a new secret at the next start locks out every client
and peer that holds the old one)."""
from __future__ import annotations

import os

from helpers.powercut import PowerCut
from sparkmq.durable import replace_durably
from sparkmq.secretfile import load_or_create


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
