"""The import contracts (pyproject.toml's [tool.importlinter]; docs/testing.md): they
pass today, a new violation breaks them, and none ignores an import.

scripts/lint-imports checks them on a view of the package tree (make lint runs it
too). The runs that break a contract do it in a copy of the tree under tmp_path
(--root): nothing is written into the repository. Each run takes about a second.
"""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "lint-imports"
CONTRACTS = ["one way", "core is plain Python", "culler talks to the hub over HTTP only",
             "notebook-server code imports no hub side", "shapes independent",
             "no sibling cycles"]


def lint(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def verdicts(output: str) -> dict[str, str]:
    """Each contract's KEPT or BROKEN, from lint-imports' summary lines."""
    found = {}
    for line in output.splitlines():
        for name in CONTRACTS:
            if line.startswith(f"{name} KEPT") or line.startswith(f"{name} BROKEN"):
                found[name] = line[len(name):].split()[0]
    return found


def copy_tree(dest: Path) -> Path:
    """The Python source of the packages pyproject maps, and pyproject.toml, in dest."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]

    def not_source(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n in ("__pycache__", "node_modules")
                or (not n.endswith(".py") and not Path(folder, n).is_dir())}

    for folder in set(setuptools["package-dir"].values()):
        shutil.copytree(ROOT / folder, dest / folder, ignore=not_source)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def test_the_contracts_hold_from_any_folder(tmp_path):
    done = lint(cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert verdicts(done.stdout) == dict.fromkeys(CONTRACTS, "KEPT"), done.stdout


def test_a_new_violation_breaks_its_contract(tmp_path):
    tree = copy_tree(tmp_path / "tree")
    # The rules reach the database; the culler reads the hub's tables; a spawner
    # module imports the hub (one way, and a cycle between the two).
    (tree / "gpulease/core/billing_rows.py").write_text("import sqlalchemy\n")
    (tree / "idle-culler/peek.py").write_text("from gpulease.store import db\n")
    (tree / "spawners/tier_names.py").write_text("from gpulease.hub import app\n")
    done = lint("--root", tree)
    assert done.returncode != 0, done.stdout
    assert verdicts(done.stdout) == {
        "one way": "BROKEN", "core is plain Python": "BROKEN",
        "culler talks to the hub over HTTP only": "BROKEN",
        "notebook-server code imports no hub side": "KEPT", "shapes independent": "KEPT",
        "no sibling cycles": "BROKEN"}, done.stdout
    assert "gpulease.core.billing_rows -> sqlalchemy" in done.stdout
    assert "gpulease.idle_culler.peek -> gpulease.store.db" in done.stdout
    assert "gpulease.spawners.tier_names -> gpulease.hub.app" in done.stdout


def test_no_contract_ignores_an_import():
    """An import against a contract is moved, never excused: no contract has an ignore
    list (the issue "One way down" emptied them), and all six are there."""
    text = (ROOT / "pyproject.toml").read_text()
    contracts = tomllib.loads(text)["tool"]["importlinter"]["contracts"]
    assert [c["name"] for c in contracts] == CONTRACTS
    assert [c["name"] for c in contracts if "ignore_imports" in c] == []


def test_no_type_only_import_points_up_either():
    """The contracts leave out imports made only for type checking (a TYPE_CHECKING block:
    annotations between the two shapes' modules need them). None of those may point up
    a layer either: what a lower layer needs of a higher one is declared below it, as
    the meter the spawners use is (gpulease/core/billing/ports.py)."""
    import ast

    above = {"spawners": ("gpulease.hub",), "idle-culler": ("gpulease.hub", "gpulease.spawners"),
             "gpulease/store": ("gpulease.hub", "gpulease.spawners"),
             "gpulease/host": ("gpulease.hub", "gpulease.spawners", "gpulease.store"),
             "gpulease/core": ("gpulease.hub", "gpulease.spawners", "gpulease.store",
                               "gpulease.host")}
    found = []
    for folder, forbidden in above.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                found += [f"{path.relative_to(ROOT)}:{node.lineno} {name}" for name in names
                          if any(name == f or name.startswith(f + ".") for f in forbidden)]
    assert not found, found


def test_no_private_name_crosses_a_module():
    """A name with a leading underscore is its module's own: no other module of gpulease
    imports one (tests may, to test it). What two modules share is public, and named so."""
    import ast

    folders = ["hub", "spawners", "idle-culler", "singleuser", "images", "gpulease", "bench"]
    found = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                        "gpulease"):
                    found += [f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{a.name}"
                              for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, found
