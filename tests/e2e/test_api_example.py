"""End to end: docs/examples/start_gpu_server.py, run as a user would, on a real hub.

The example creates a named server with a MIG slice profile, starts it with an
empty body, follows its progress, runs code on a kernel over the websocket
and stops it, with a token that holds only the scopes docs/vscode.md lists.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "start_gpu_server.py"
# The scopes docs/vscode.md and the example's docstring name for a script's token.
SCRIPT_SCOPES = ["read:users:name!user", "read:servers!user", "servers!user",
                 "access:servers!user", "access:services!service=gpulease"]


def test_the_python_example_runs_code_on_a_named_gpu_server(hub):
    admin = hub.admin_token
    r = hub.service("POST", "api/users", admin, {"name": "sam", "password": "sam-pw-123456"})
    assert r.status_code == 201, r.text
    hub.grant(admin, "user:sam")
    r = hub.api("POST", "users/sam/tokens", hub.token_for("sam", "sam-pw-123456"),
                {"note": "script", "scopes": SCRIPT_SCOPES})
    assert r.status_code == 201, r.text
    token = r.json()["token"]

    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--server", "train", "--profile", "h200-1g",
         "--code", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"],
        env={**os.environ, "GPULEASE_URL": hub.url, "GPULEASE_TOKEN": token},
        capture_output=True, text=True, timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr + hub.log()[-3000:]
    lines = run.stdout.splitlines()
    # (a start quicker than JupyterHub's slow_spawn_timeout answers once ready: then the
    # progress stream has only its last event)
    # the server's own origin (a subdomain of the hub's host), as JupyterHub says it
    assert f"progress: Server ready at {hub.server_url('sam', 'train')}" in lines, lines
    (output,) = [line for line in lines if line.startswith("output: ")]
    assert output.startswith("output: MIG-declared-")
    assert lines[-1].startswith("stopped train: h200-1g, ") and lines[-1].endswith(" credits")

    # stopped, released, billed once at the profile; the server keeps its profile
    model = hub.api("GET", "users/sam?include_stopped_servers=1", admin).json()
    assert model["servers"]["train"]["user_options"] == {"profile": "h200-1g"}
    assert not model["servers"]["train"]["ready"]
    (session,) = hub.service("GET", "api/usage?user=sam", admin).json()["sessions"]
    assert session["profile"] == "h200-1g" and session["end_reason"] == "user"

    # run again: the existing server is reused (its options replaced), not refused
    again = subprocess.run(
        [sys.executable, str(EXAMPLE), "--url", hub.url, "--server", "train",
         "--profile", "cpu", "--code", "print('hello')"],
        env={**os.environ, "GPULEASE_TOKEN": token}, capture_output=True, text=True,
        timeout=180,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "output: hello" in again.stdout and "stopped train: cpu, " in again.stdout
