"""Names are matched whole by the commands too: a topic ``"Known\\n"`` or a group
``"GNL\\n"`` (a trailing newline that ``re.match`` with ``$`` let through) is refused
by ``sparkmq create-topic`` and ``sparkmq admin topic/group create``, naming the bad
character, and nothing is created. Fast tier: a real store, no servers."""
from __future__ import annotations

import pytest

from sparkmq import Store
from sparkmq.admin import main as admin
from sparkmq.cli import main


@pytest.fixture
def url(tmp_path):
    u = str(tmp_path / "s")
    Store.open(u, start_services=False).close()
    return u


def _names(url):
    with Store.open(url, mode="r") as s:
        return set(s.topics()), set(s.subscription_groups())


@pytest.mark.parametrize("argv", [
    ["create-topic", "{url}", "Known\n"],
    ["admin", "--store", "{url}", "topic", "create", "Known\n"],
    ["admin", "--store", "{url}", "group", "create", "GNL\n"],
], ids=["create-topic", "admin topic create", "admin group create"])
def test_a_name_with_a_trailing_newline_is_refused(url, argv, capsys):
    argv = [a.format(url=url) for a in argv]
    code = admin(argv[1:]) if argv[0] == "admin" else main(argv)
    assert code == 1
    assert "'\\n'" in capsys.readouterr().err
    topics, groups = _names(url)
    assert not {"Known\n", "Known"} & topics and "GNL\n" not in groups
