"""The import contracts (pyproject.toml's [tool.importlinter]; docs/testing.md): they
pass today, a new violation breaks them, and their ignore lists only shrink.

scripts/lint-imports checks them on a view of the package tree (make lint runs it
too). The runs that break a contract do it in a copy of the tree under tmp_path
(--root): nothing is written into the repository. Each run takes about a second.
"""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "lint-imports"
NOTE = ("# Known violations, to be removed as the modules move (issue One way down); "
        "never add to this list.")
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


def test_an_ignored_import_that_goes_must_leave_the_list(tmp_path):
    """An ignore line that matches no import (its import went, or never was) fails its
    contract: an ignore list cannot outlive what it excuses."""
    tree = copy_tree(tmp_path / "tree")
    pyproject = tree / "pyproject.toml"
    text = pyproject.read_text()
    layers = 'layers = ["gpulease.hub", "gpulease.spawners", "gpulease.store", "gpulease.host", '
    assert layers in text
    stale = '"gpulease.spawners.kube -> gpulease.hub.app"'
    extra = f"\nignore_imports = [{stale}]" if "\nignore_imports" not in text.split(layers)[1] \
        .split("[[tool.importlinter.contracts]]")[0] else ""
    if extra:
        line_end = text.index("\n", text.index(layers))
        text = text[:line_end] + extra + text[line_end:]
    else:
        start = text.index("ignore_imports = [", text.index(layers))
        text = text[:start] + f"ignore_imports = [{stale}, " + text[start + 18:]
    pyproject.write_text(text)
    done = lint("--root", tree)
    assert done.returncode != 0, done.stdout
    assert "gpulease.spawners.kube -> gpulease.hub.app" in done.stdout + done.stderr


def within(module: str, packages: list[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_the_ignore_lists_are_sorted_violations_under_their_note():
    text = (ROOT / "pyproject.toml").read_text()
    contracts = tomllib.loads(text)["tool"]["importlinter"]["contracts"]
    assert [c["name"] for c in contracts] == CONTRACTS
    assert text.count("\nignore_imports = [") == text.count(f"{NOTE}\nignore_imports = [")
    for contract in contracts:
        pairs = [tuple(line.split(" -> ")) for line in contract.get("ignore_imports", [])]
        assert pairs == sorted(set(pairs)), contract["name"]
        for importer, imported in pairs:
            if contract["type"] == "layers":  # a layer importing one above it
                layers = contract["layers"]
                below = [i for i, p in enumerate(layers) if within(importer, [p])]
                above = [i for i, p in enumerate(layers) if within(imported, [p])]
                assert below and above and above[0] < below[0], (importer, imported)
            elif contract["type"] == "forbidden":
                assert within(importer, contract["source_modules"]), importer
                assert within(imported, contract["forbidden_modules"]), imported
