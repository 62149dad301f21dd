"""The tests stay sorted by kind (docs/testing.md, "The tests by kind"): every test module
sits in its kind's folder, the unit tests mirror the packages and need nothing of the
machine, and no kind's test imports another kind's test module but through what it
shares on purpose."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
KINDS = ("unit", "integration", "e2e", "browser", "cluster", "checks")
# tests/unit/<first folder> mirrors this package folder
MIRRORED = {"core": ROOT / "gpulease" / "core", "host": ROOT / "gpulease" / "host",
            "spawners": ROOT / "spawners", "hub": ROOT / "hub",
            "culler": ROOT / "idle-culler", "singleuser": ROOT / "singleuser"}
# what a unit test may not reach: the database, processes, sockets, a hub
NOT_IN_UNIT = ("subprocess", "socket", "sqlalchemy", "psycopg", "tests.support.hubproc",
               "tests.support.databases", "tests.support.processes", "gpulease.store.db")
MACHINE_FIXTURES = {"db_url", "engine", "postgres_database", "module_postgres_database",
                    "chromium", "browser_context"}


def _test_modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "tools" not in p.parts)


def imported(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_every_test_module_sits_in_its_kinds_folder():
    misplaced = [str(p.relative_to(TESTS)) for p in _test_modules()
                 if p.relative_to(TESTS).parts[0] not in KINDS]
    assert not misplaced, f"test modules outside {KINDS}: {misplaced}"


def test_the_unit_tests_mirror_the_packages():
    for folder in sorted(p for p in (TESTS / "unit").rglob("*") if p.is_dir()
                         and p.name != "__pycache__"):
        first, *rest = folder.relative_to(TESTS / "unit").parts
        assert first in MIRRORED, f"tests/unit/{first}/ mirrors no package ({list(MIRRORED)})"
        assert MIRRORED[first].joinpath(*rest).is_dir(), \
            f"{folder.relative_to(ROOT)} mirrors {MIRRORED[first].joinpath(*rest)}, which is gone"


def machine_needs(path: Path) -> list[str]:
    """What of the machine a test module reaches (NOT_IN_UNIT, MACHINE_FIXTURES)."""
    found = []
    tree = ast.parse(path.read_text())
    for name in sorted(imported(tree)):
        if any(name == bad or name.startswith(bad + ".") for bad in NOT_IN_UNIT):
            found.append(f"{path.name} imports {name}")
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [f"{path.name}: {node.name} takes {arg.arg}" for arg in node.args.args
                      if arg.arg in MACHINE_FIXTURES]
    return found


def test_a_unit_test_needs_nothing_of_the_machine():
    found = [need for path in _test_modules() if path.relative_to(TESTS).parts[0] == "unit"
             for need in machine_needs(path)]
    assert not found, "unit tests that need the machine (move them to tests/integration/ " \
        "or further):\n" + "\n".join(found)


def test_the_check_sees_a_database_a_process_and_a_fixture(tmp_path):
    module = tmp_path / "test_x.py"
    module.write_text("import subprocess\nfrom gpulease.store.db import open_database\n\n\n"
                      "def test_y(engine):\n    pass\n")
    assert machine_needs(module) == ["test_x.py imports gpulease.store.db",
                                     "test_x.py imports subprocess",
                                     "test_x.py: test_y takes engine"]
