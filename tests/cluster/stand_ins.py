"""Image stand-ins of a test's own for the kubelet emulator (tests/cluster/pod_plan.py).

`map_stand_in` adds an image to the emulator's images.json (read at each pod start)
with what ControlPlane.map_image does not set: a pull delay, say. `server_stand_in`
makes a stand-in whose `gpulease-singleuser` (the server script every gpulease pod
runs) is a shell script of the test's: a server that works before it answers, or one
that never answers. Image names are the test's own (its namespace in them), so tests
sharing the control plane never see each other's.
"""

from __future__ import annotations

import fcntl
import json
import stat
from pathlib import Path

from gpulease.singleuser import SERVER_SCRIPT
from tests.cluster.conftest import POD_UID, ControlPlane
from tests.support.isolation_env import hub_python


def ours() -> Path:
    """gpulease's own environment: the stand-in of the catalog's images."""
    return Path(hub_python()[0]).parent.parent


def map_stand_in(plane: ControlPlane, image: str, prefix: Path | str, user: int = POD_UID,
                 **extra: object) -> None:
    """Map `image` to the local environment `prefix`, with `extra` fields (pull_delay_s).
    Under a lock, and read back: other workers of the run map images too."""
    path = Path(plane.state["images"])
    entry = {"prefix": str(prefix), "user": user, **extra}
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for _ in range(5):
            images = json.loads(path.read_text())
            images[image] = entry
            tmp = path.with_suffix(f".tmp-{image.replace('/', '_').replace(':', '_')}")
            tmp.write_text(json.dumps(images, indent=1))
            tmp.rename(path)
            if json.loads(path.read_text()).get(image) == entry:
                return
    raise AssertionError(f"could not map {image} in {path}")


def server_stand_in(plane: ControlPlane, name: str, script: str) -> Path:
    """A stand-in environment whose `gpulease-singleuser` runs `script` (sh), which may
    `exec "$REAL" "$@"` to go on as the real server; its prefix."""
    prefix = plane.root / "stand-ins" / name
    bin_dir = prefix / "bin"
    bin_dir.mkdir(parents=True)
    for folder in (plane.root / "stand-ins", prefix, bin_dir):
        folder.chmod(0o755)
    real = ours() / "bin" / SERVER_SCRIPT
    server = bin_dir / SERVER_SCRIPT
    server.write_text(f"#!/bin/sh\nREAL={str(real)!r}\nPATH={str(ours() / 'bin')!r}:$PATH\n"
                      f"export PATH\n{script}\n")
    server.chmod(server.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
                 | stat.S_IRGRP | stat.S_IROTH)
    return prefix
