"""What a fresh process pays to import the data source (Spark starts one per streaming
query): the store's writer, its services and fsspec stay unloaded for a local store."""
from __future__ import annotations

import subprocess
import sys

import pytest

from sparkmq.log.fs import StoreFS, local_root


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\n"
                          "print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=120, check=True)
    return set(out.stdout.split())


@pytest.mark.integration   # a fresh python process
def test_the_stream_reader_of_a_local_store_loads_neither_the_store_nor_fsspec(tmp_path):
    from sparkmq import Store
    url = str(tmp_path / "s")
    with Store.open(url, mode="w", start_services=False) as s:
        s.create_topic("T", write_queue_nums=2, read_queue_nums=2)
    mods = _modules_after(
        "from sparkmq.datasource.stream import SparkMQStreamReader\n"
        f"r = SparkMQStreamReader({{'path': {url!r}, 'topic': 'T', "
        "'startingOffsets': 'earliest'})\n"
        "r.prepareForTriggerAvailableNow()\n"
        "start = r.initialOffset()\n"
        "print(r.partitions(start, r.latestOffset(start, None)))\n")
    assert "sparkmq.datasource.reader" in mods
    assert "fsspec" not in mods
    assert "sparkmq.log.store" not in mods and "sparkmq.log.services" not in mods


@pytest.mark.integration   # a fresh python process
def test_public_names_still_import_from_the_packages():
    mods = _modules_after("from sparkmq import Store, Snapshot, SYNC_FLUSH, SparkMQError\n"
                          "from sparkmq.log import Store as S2, GetMessageStatus\n"
                          "assert Store is S2\n")
    assert "sparkmq.log.store" in mods
    import sparkmq
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        sparkmq.Nope   # noqa: B018


@pytest.mark.parametrize("url", ["/abs/dir", "/abs/dir/", "file:///abs/dir", "/", "/a b/c",
                                 "/abs//dir", "file:///a/b/."])
def test_local_roots_are_those_fsspec_gives(url):
    import fsspec
    expected = fsspec.core.url_to_fs(url)[1].rstrip("/") or "/"
    assert local_root(url) == expected
    assert StoreFS(url).root == expected and StoreFS(url).is_local


@pytest.mark.parametrize("url", ["rel/dir", "~/x", "memory://x", "simplecache::file:///a",
                                 "s3://bucket/p"])
def test_other_urls_are_left_to_fsspec(url):
    assert local_root(url) is None


def test_a_local_store_with_storage_options_goes_through_fsspec(tmp_path):
    sfs = StoreFS(str(tmp_path), {"auto_mkdir": True})
    assert sfs._fs is not None and sfs.is_local
    sfs.write("a/b", b"x")
    assert sfs.exists("a/b") and sfs.read_bytes("a/b") == b"x"
