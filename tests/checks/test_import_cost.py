"""The hub's processes skip jsonschema's RFC 3987 parser (gpulease.skip_rfc3987_grammar): ~1.5 s
a start. Each entry point makes that call itself; importing a package does nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
import jsonschema
# jsonschema works as before without the parser: other formats are still checked.
checker = jsonschema.FormatChecker()
assert not checker.conforms("not-an-email", "email")
assert checker.conforms("a@b.example", "email")
print("ok")
"""

# Each entry point of the hub's processes, run as it is run, until JupyterHub and the
# process's own modules are imported; at exit it reports whether the parser was built
# (rfc3987_syntax imported) and that JupyterHub was imported (so the check means something).
REPORT = """
import atexit, sys
def report():
    print(sys.modules.get("rfc3987_syntax", "missing") is None, "jupyterhub" in sys.modules)
atexit.register(report)
"""
ENTRY_POINTS = {
    # `gpulease up --help-all`: the hub app is imported, its options printed, no hub started
    "gpulease up": "sys.argv = ['gpulease', 'up', '--help-all']\n"
                   "from gpulease.hub.cli import main\nmain()",
    # `python -m gpulease.hub.service` with a port that is not one: it ends once imported
    "the service": "import os, runpy\nos.environ['GPULEASE_SERVICE_PORT'] = 'not-a-port'\n"
                   "runpy.run_module('gpulease.hub.service', run_name='__main__')",
    # `python -m gpulease.idle_culler --help`
    "the culler": "import runpy\nsys.argv = ['gpulease-culler', '--help']\n"
                  "runpy.run_module('gpulease.idle_culler', run_name='__main__')",
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_each_hub_side_entry_point_skips_the_rfc3987_parser(entry):
    done = subprocess.run([sys.executable, "-c", REPORT + ENTRY_POINTS[entry]],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.split()[-2:] == ["True", "True"], done.stdout[-2000:] + done.stderr


def test_jsonschema_still_validates_without_the_parser():
    done = subprocess.run([sys.executable, "-c", "from gpulease import skip_rfc3987_grammar\n"
                           "skip_rfc3987_grammar()\n" + PROBE],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_importing_a_package_does_nothing():
    """A package's __init__ has no side effect: importing every one of gpulease's packages
    sets no parser aside and imports no framework. Entry points make their own calls."""
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    packages = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["packages"]
    assert "gpulease.hub.service.api" in packages and "gpulease.core.model" in packages
    probe = ("import importlib, sys\n"
             f"for name in {packages!r}:\n"
             "    importlib.import_module(name)\n"
             "heavy = ('jupyterhub', 'tornado', 'sqlalchemy', 'jsonschema', 'kubernetes_asyncio',"
             " 'pynvml', 'rfc3987_syntax')\n"
             "print(sorted(m for m in heavy if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


SERVER_PROBE = """
import atexit, sys
def report():
    print(sys.modules.get("rfc3987_syntax", "missing") is None,
          "jupyterhub.singleuser" in sys.modules)
atexit.register(report)
sys.argv = ["gpulease-singleuser", "--version"]
from gpulease.singleuser.launch import main
main()
"""


def test_a_notebook_server_starts_without_building_the_rfc3987_parser():
    """`gpulease-singleuser` (what the spawners run) loads jupyterhub.singleuser
    with the parser skipped: ~1.5 s of every server's start."""
    done = subprocess.run([sys.executable, "-c", SERVER_PROBE], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split()[-2:] == ["True", "True"], done.stdout + done.stderr
