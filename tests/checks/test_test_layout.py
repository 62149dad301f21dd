"""The tests stay sorted by kind (docs/testing.md, "The tests by kind"): every test module
sits in its kind's folder, the unit tests mirror the packages and need nothing of the
machine, and no test module imports a test module of another kind (what kinds share is
in tests/support/)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
KINDS = ("unit", "integration", "e2e", "browser", "cluster", "checks")
TOOLS = TESTS / "cluster" / "tools"  # the control plane's Go sources, not tests
# tests/unit/<first folder> mirrors this package folder
MIRRORED = {"core": ROOT / "gpulease" / "core", "host": ROOT / "gpulease" / "host",
            "spawners": ROOT / "spawners", "hub": ROOT / "hub",
            "culler": ROOT / "idle-culler", "singleuser": ROOT / "singleuser"}
# what a unit test may not reach: the database, processes, sockets, servers, a hub
NOT_IN_UNIT = ("subprocess", "socket", "sqlalchemy", "psycopg", "multiprocessing",
               "http.server", "tornado.testing", "tornado.httpserver", "aiohttp.web",
               "importlib", "gpulease.store.db",
               *(f"tests.support.{helper}" for helper in (
                   "hubproc", "databases", "processes", "isolation_env", "prometheus_double",
                   "metrics_api_double", "culler_fakehub", "sinks", "oidc_provider",
                   "github_double", "tcpproxy", "helm", "vscode_client", "queue_reads",
                   "reservation_clock")))
# a unit test may not create a subprocess through asyncio either
NOT_CALLED_IN_UNIT = ("create_subprocess_exec", "create_subprocess_shell")
MACHINE_FIXTURES = {"db_url", "engine", "postgres_database", "module_postgres_database",
                    "chromium", "browser_context", "tmp_path_factory"}


def _python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if TOOLS not in p.parents)


def _test_modules() -> list[Path]:
    return [p for p in _python_files() if p.name.startswith("test_")]


def _kind(path: Path, tests: Path = TESTS) -> str:
    return path.relative_to(tests).parts[0]


def imported(tree: ast.AST) -> set[str]:
    """Every module a tree imports, `from a import b` counted as a and as a.b."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def machine_needs(path: Path) -> list[str]:
    """What of the machine a module reaches (NOT_IN_UNIT, NOT_CALLED_IN_UNIT,
    MACHINE_FIXTURES as arguments or in usefixtures)."""
    found = []
    tree = ast.parse(path.read_text())
    for name in sorted(imported(tree)):
        if any(name == bad or name.startswith(bad + ".") for bad in NOT_IN_UNIT):
            found.append(f"{path.name} imports {name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in NOT_CALLED_IN_UNIT:
            found.append(f"{path.name} calls {node.attr}")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
            found += [f"{path.name}: {node.name} takes {arg.arg}" for arg in args
                      if arg.arg in MACHINE_FIXTURES]
        if isinstance(node, ast.Constant) and node.value in MACHINE_FIXTURES:
            found.append(f"{path.name} names the fixture {node.value}")
    return found


def other_kinds_tests(path: Path, tests: Path = TESTS) -> list[str]:
    """The test modules of another kind that a module (under `tests`) imports."""
    kind = _kind(path, tests)
    return [f"{path.relative_to(tests)} imports {name}"
            for name in sorted(imported(ast.parse(path.read_text())))
            if name.startswith("tests.") and len(name.split(".")) > 2
            and name.split(".")[1] in KINDS and name.split(".")[1] != kind
            and any(part.startswith("test_") for part in name.split(".")[2:])]


def test_every_test_module_sits_in_its_kinds_folder():
    misplaced = [str(p.relative_to(TESTS)) for p in _test_modules() if _kind(p) not in KINDS]
    assert not misplaced, f"test modules outside {KINDS}: {misplaced}"


def test_pytest_collects_test_modules_by_one_pattern():
    """pytest's default also collects *_test.py, which the kinds' check would not see."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'python_files = ["test_*.py"]' in pyproject


def test_the_unit_tests_mirror_the_packages():
    for folder in sorted(p for p in (TESTS / "unit").rglob("*") if p.is_dir()
                         and p.name != "__pycache__"):
        first, *rest = folder.relative_to(TESTS / "unit").parts
        assert first in MIRRORED, f"tests/unit/{first}/ mirrors no package ({list(MIRRORED)})"
        assert MIRRORED[first].joinpath(*rest).is_dir(), \
            f"{folder.relative_to(ROOT)} mirrors {MIRRORED[first].joinpath(*rest)}, which is gone"


def test_a_unit_test_needs_nothing_of_the_machine():
    found = [need for path in _python_files() if _kind(path) == "unit"
             for need in machine_needs(path)]
    assert not found, "unit tests that need the machine (move them to tests/integration/ " \
        "or further):\n" + "\n".join(found)


def test_no_test_module_imports_another_kinds_tests():
    found = [f for path in _python_files() for f in other_kinds_tests(path)]
    assert not found, "move what they share to tests/support/:\n" + "\n".join(found)


def test_the_check_sees_a_database_a_process_and_a_fixture(tmp_path):
    module = tmp_path / "test_x.py"
    module.write_text(
        "import asyncio\nfrom gpulease.store import db\nfrom tests.support import hubproc\n\n\n"
        "@pytest.mark.usefixtures('postgres_database')\n"
        "async def test_y(*, engine):\n    await asyncio.create_subprocess_exec('true')\n")
    assert sorted(machine_needs(module)) == [
        "test_x.py calls create_subprocess_exec", "test_x.py imports gpulease.store.db",
        "test_x.py imports tests.support.hubproc", "test_x.py names the fixture postgres_database",
        "test_x.py: test_y takes engine"]


def test_the_check_sees_another_kinds_test_module(tmp_path):
    module = tmp_path / "e2e" / "test_x.py"
    module.parent.mkdir()
    module.write_text("from tests.unit.hub.test_y import z\nfrom tests.e2e.test_w import v\n"
                      "from tests.support.pages import bar\n")
    assert [f.split(" imports ")[1] for f in other_kinds_tests(module, tmp_path)] == [
        "tests.unit.hub.test_y", "tests.unit.hub.test_y.z"]
