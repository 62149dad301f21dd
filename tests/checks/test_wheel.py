"""The wheel holds every module of the source tree, and each imports from it.

setuptools cannot discover subpackages through package-dir (pyproject.toml lists
them by hand), so a new folder left off that list is missing from the wheel while
every test of the checkout passes: an editable install reads the tree. This builds
the wheel from a copy of the tracked files, without build isolation (no network
here; the backend comes from the test environment), and imports every module from
the unpacked wheel alone.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Run as programs, never imported: an alembic environment runs its migrations on import.
NOT_IMPORTED = {"gpulease.store.migrations.env"}


def source_modules() -> set[str]:
    """Every tracked .py file under a folder pyproject maps, as its dotted name."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
    modules = set()
    for package, folder in setuptools["package-dir"].items():
        for path in tracked:
            if not path.startswith(folder + "/"):
                continue
            parts = Path(path[len(folder) + 1:]).with_suffix("").parts
            modules.add(".".join((package, *parts)).removesuffix(".__init__"))
    return modules


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "tree"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.splitlines()
    for path in tracked:
        source = ROOT / path
        if source.is_file() and not source.is_symlink():
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / path)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
         "--no-index", "--quiet", "-w", str(tmp / "dist"), str(tree)],
        capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    [found] = (tmp / "dist").glob("gpulease-*.whl")
    site = tmp / "site"
    with zipfile.ZipFile(found) as archive:
        archive.extractall(site)
    return site


def wheel_modules(site: Path) -> set[str]:
    return {".".join(p.relative_to(site).with_suffix("").parts).removesuffix(".__init__")
            for p in (site / "gpulease").rglob("*.py")}


def test_the_wheel_holds_every_module_of_the_tree(wheel):
    missing = sorted(source_modules() - wheel_modules(wheel))
    assert not missing, ("modules missing from the wheel (add their package to "
                         f"[tool.setuptools] packages in pyproject.toml): {missing}")


def test_the_wheel_holds_the_files_modules_read(wheel):
    """Templates, samples, migrations, the catalog, the API's document and the
    JupyterLab extension: data setuptools takes only where package-data names it."""
    from gpulease.core.model.inventory import DEMO_INVENTORY
    from gpulease.core.model.profiles import SAMPLE_PROFILES
    from gpulease.images import CATALOG_PATH

    named = [DEMO_INVENTORY, SAMPLE_PROFILES, CATALOG_PATH]
    in_folders = ["hub/templates", "hub/service/templates", "gpulease/store/migrations",
                  "singleuser/labextension/prebuilt"]
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folder_of = {folder: package for package, folder in setuptools["package-dir"].items()}

    def in_wheel(path: Path) -> Path:
        relative = path.resolve().relative_to(ROOT)
        top = relative.parts[0]
        return wheel.joinpath(*folder_of[top].split("."), *relative.parts[1:])

    tracked = subprocess.run(["git", "ls-files", *in_folders], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
    files = [*named, *(ROOT / t for t in tracked)]
    assert len(files) > 40, files
    missing = [str(f.relative_to(ROOT)) for f in files if not in_wheel(f).is_file()]
    assert not missing, f"files missing from the wheel (pyproject's package-data): {missing}"


def test_every_module_imports_from_the_wheel_alone(wheel):
    """A fresh interpreter without site (so no editable install's finder can answer from
    the checkout), the wheel first on its path and the environment's packages after it."""
    modules = sorted(m for m in wheel_modules(wheel) - NOT_IMPORTED
                     if not m.endswith(".__main__"))  # `python -m`'s: importing runs them
    check = (
        "import importlib, sys\n"
        f"site = {str(wheel)!r}\n"
        "failed = []\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        module = importlib.import_module(name)\n"
        "    except Exception as e:\n"
        "        failed.append(f'{name}: {type(e).__name__}: {e}')\n"
        "        continue\n"
        "    if not (module.__file__ or '').startswith(site):\n"
        "        failed.append(f'{name}: imported from {module.__file__}, not the wheel')\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n")
    path = [str(wheel), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    done = subprocess.run([sys.executable, "-S", "-c", check, *modules], capture_output=True,
                          text=True, timeout=300, cwd=wheel,
                          env={"PYTHONPATH": ":".join(path), "PATH": "/usr/bin:/bin",
                               "HOME": str(wheel)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(modules) > 200, len(modules)
