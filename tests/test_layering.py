"""The layering contract (STYLE.md 9 and 12): the import-linter contracts in pyproject.toml
(``[tool.importlinter]``) hold for the package (checked by a linter process); a
forbidden import added to a copy of it breaks them (a linter process on the copy, so the
check can fail); and ``sparkmq/ha/`` uses no underscored name of the
log layer's objects (an AST scan: layers talk through public APIs)."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sparkmq"
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def lint_imports(project: Path) -> subprocess.CompletedProcess:
    """Run import-linter on the ``sparkmq`` package under ``project`` with the contracts in
    ``project/pyproject.toml``, in a fresh process whose ``sparkmq`` is that copy."""
    return subprocess.run([sys.executable, "-c", LINT, "--config", "pyproject.toml",
                           "--no-cache"], cwd=project, env={"PYTHONPATH": str(project),
                                                            "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)


def copy_project(dest: Path) -> Path:
    shutil.copytree(PACKAGE, dest / "sparkmq", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def test_the_layering_contracts_hold():
    # (in a process of its own: the linter's logging set-up disables every existing
    # logger of the process it runs in, which breaks caplog in later tests)
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout


@pytest.mark.integration
def test_a_forbidden_import_breaks_the_contract(tmp_path):
    project = copy_project(tmp_path)
    fmt = project / "sparkmq" / "log" / "format.py"
    fmt.write_text(fmt.read_text() + "\nimport sparkmq.broker  # forbidden: log below broker\n")
    result = lint_imports(project)
    assert result.returncode != 0
    out = result.stdout
    assert "sparkmq.log imports no upper layer, no Spark and no network stack BROKEN" in out
    assert "sparkmq.log.format -> sparkmq.broker" in out


def private_uses(source: str, filename: str) -> list[str]:
    """``X._name`` attribute accesses where ``X`` is not ``self``/``cls`` (dunder names
    excepted), and ``from ..log... import _name``, in one module's source."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not (node.attr.startswith("__") and node.attr.endswith("__")) \
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.append(f"{filename}:{node.lineno}: .{node.attr}")
        if isinstance(node, ast.ImportFrom) and _from_log(node):
            found += [f"{filename}:{node.lineno}: import {a.name}" for a in node.names
                      if a.name.startswith("_")]
    return found


def _from_log(node: ast.ImportFrom) -> bool:
    module = node.module or ""
    if node.level == 0:
        return module == "sparkmq.log" or module.startswith("sparkmq.log.")
    return node.level == 2 and (module == "log" or module.startswith("log."))


def test_the_scan_finds_private_uses():
    src = ("from ..log.store import _LIVE\nfrom ..log import Store\n"
           "def f(store):\n    self._ok = store._dispatched_offset\n    return cls._ok, x.__dict__\n")
    assert private_uses(src, "m.py") == ["m.py:1: import _LIVE", "m.py:4: ._dispatched_offset"]


def log_private_names() -> set[str]:
    """Underscored names the log layer defines: methods, attributes set on ``self``, and
    module-level names of ``sparkmq/log/*.py``."""
    names = set()
    for path in (PACKAGE / "log").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_ha_uses_no_private_name_at_all():
    found = [use for path in sorted((PACKAGE / "ha").glob("*.py"))
             for use in private_uses(path.read_text(), f"sparkmq/ha/{path.name}")]
    assert found == [], "ha/ reaches into private names:\n" + "\n".join(found)


def test_no_layer_above_the_log_uses_its_private_names():
    private = log_private_names()
    assert {"_entries", "_topic_id", "_dispatch"} & private     # the scan sees the log
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)
        if rel.parts[1] == "log":
            continue
        found += [use for use in private_uses(path.read_text(), str(rel))
                  if use.rsplit(".", 1)[-1] in private or " import _" in use]
    assert found == [], "layers above the log reach into its private names:\n" + \
        "\n".join(found)


# JSON names that only transaction-log actions use (FORMAT.md section 5): code reads
# these values as attributes of the typed actions (sparkmq/log/actions.py), never by name
ACTION_ONLY_JSON_NAMES = {
    "readQueueNums", "writeQueueNums", "retentionMs", "retentionBytes", "retryMaxTimes",
    "consumeEnable", "consumeBroadcastEnable", "groupName", "baseOffset", "reservedSize",
    "modificationTime", "topicIds", "minBatchOffset", "maxBatchOffset", "minPhysicalOffset",
    "expiresTime", "acquiredTime", "deletionTimestamp", "dataChange", "minReaderVersion",
    "minWriterVersion"}
# where those names are a wire format of their own: the NameServer's registration and
# route JSON, the admin HTTP request bodies and the HA frame headers (read from variables
# named ``request`` and ``header``)
WIRE_PACKAGES = ("namesrv",)


def action_name_lookups(source: str, filename: str) -> list[str]:
    """``x["readQueueNums"]`` / ``x.get("readQueueNums")`` uses of action-only JSON
    names, except on an HTTP ``request`` body or an HA frame ``header``."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Subscript):
            base, key = node.value, node.slice
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "get" and node.args):
            base, key = node.func.value, node.args[0]
        else:
            continue
        if not (isinstance(key, ast.Constant) and key.value in ACTION_ONLY_JSON_NAMES):
            continue
        if isinstance(base, ast.Name) and base.id in ("request", "header"):
            continue
        out.append(f"{filename}:{node.lineno}: [{key.value!r}]")
    return out


def test_the_action_scan_finds_a_lookup_by_name():
    src = 'def f(conf, request):\n    request.get("retryMaxTimes")\n' \
          '    return conf["writeQueueNums"], conf.get("baseOffset")\n'
    assert len(action_name_lookups(src, "x.py")) == 2


def test_no_module_looks_up_an_action_field_by_its_json_name():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in WIRE_PACKAGES or rel == Path("log/actions.py"):
            continue
        found += action_name_lookups(path.read_text(), str(rel))
    assert not found, "use the typed action's attributes:\n" + "\n".join(found)
