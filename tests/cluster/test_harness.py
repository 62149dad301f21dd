"""The harness itself: one control plane shared by a run's workers, and nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import ControlPlane
from tests.cluster.controlplane import ROOT, ControlPlaneError, attach

ATTACH = """
import json, sys
from pathlib import Path
from tests.cluster.controlplane import attach, detach
state = attach(Path(sys.argv[1]))
print(json.dumps(state), flush=True)
if sys.argv[2] == "detach":
    detach(Path(sys.argv[1]))
"""

# A client that starts a control plane, runs a pod, and dies without a word.
CRASH = """
import json, os, sys, time
from pathlib import Path
from tests.cluster.controlplane import attach
from tests.cluster.kube import Kube
from tests.cluster.nodes import GpuNode, node_object
root = Path(sys.argv[1])
state = attach(root)
images = Path(state["images"])
images.write_text(json.dumps({"img": {"prefix": sys.argv[3], "user": 0}}))
kube = Kube(state["server"], Path(state["ca"]), root / "pki/admin.crt", root / "pki/admin.key")
kube.create("/api/v1/nodes", node_object(GpuNode("crash-node")))
kube.create("/api/v1/namespaces/default/pods", {"metadata": {"name": "sleeper"}, "spec": {
    "containers": [{"name": "c", "image": "img",
                    "command": ["python", "-c", "import time; time.sleep(600)", sys.argv[2]]}]}})
kube.wait_for("the pod running", lambda: kube.get(
    "/api/v1/namespaces/default/pods/sleeper")["status"].get("phase") == "Running", timeout=60)
print(json.dumps(state), flush=True)
os._exit(1)
"""


def _python(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_second_worker_shares_the_running_control_plane(control_plane: ControlPlane):
    out = _python(ATTACH, str(control_plane.root), "detach")
    assert out.returncode == 0, out.stderr
    theirs = json.loads(out.stdout)
    assert theirs["supervisor"] == control_plane.state["supervisor"]
    assert theirs["server"] == control_plane.state["server"]
    # Its leaving does not stop the control plane the others still use.
    assert control_plane.admin().get("/version")["gitVersion"] == control_plane.state["version"]


def test_a_client_that_dies_mid_test_leaves_no_process_behind(tmp_path: Path,
                                                             control_plane: ControlPlane):
    marker = f"gpulease-crash-{os.getpid()}-{time.monotonic_ns()}"
    prefix = str(Path(sys.executable).parent.parent)
    out = _python(CRASH, str(tmp_path / "plane"), marker, prefix)
    assert out.returncode == 1, out.stderr
    state = json.loads(out.stdout.splitlines()[-1])
    pids = [state["supervisor"], *state["pids"].values()]

    def leftovers() -> list[str]:
        left = [f"pid {p}" for p in pids if _alive(p)]
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    left.append(f"pod process {pid}")
            except OSError:
                pass
        return left
    deadline = time.monotonic() + 30
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="hands a folder to another account")
def test_no_control_plane_runs_from_a_folder_another_account_made(tmp_path: Path):
    # /tmp/gpulease-cluster-<run> has a name anyone can guess: made first by another
    # account, it would let them map an image to their programs for the emulator to run.
    theirs = tmp_path / "plane"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)  # nobody's
    with pytest.raises(ControlPlaneError, match=r"plane is not a folder of this account's"):
        attach(theirs, timeout=2)
    assert list(theirs.iterdir()) == []
