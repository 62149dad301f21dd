"""The hub's processes skip jsonschema's RFC 3987 parser (hub/__init__.py): ~1.5 s a start."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import gpulease.hub.app  # JupyterHub, jupyter_events, jsonschema
import jsonschema
assert sys.modules.get("rfc3987_syntax") is None, "rfc3987_syntax was imported"
# jsonschema works as before: other formats are still checked.
checker = jsonschema.FormatChecker()
assert not checker.conforms("not-an-email", "email")
assert checker.conforms("a@b.example", "email")
print("ok")
"""


def test_the_hub_does_not_build_the_rfc3987_parser_and_jsonschema_still_validates():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


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
