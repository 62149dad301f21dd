"""A hub that runs as root needs a Python environment every per-user account can run.

Where the project's .venv is out of their reach — its interpreter pyenv's
under /root, or the whole clone under /root (mode 0700) — `gpulease up` as
root would run servers from a copy of it (gpulease.hub.config.server_env). Tests
run the hub itself from such a copy, made once per session in /tmp with
the same code (gpulease.hub.config.server_env.build: the project's installed
packages, its code and Jupyter's data hard-linked, so the servers are the
same JupyterLab with the same extensions), so that the hubs and the mock
servers the tests start use one interpreter every account can run.
Nothing under /root is touched.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from functools import cache
from pathlib import Path

from gpulease.hub.config import server_env
from gpulease.hub.config.isolation_check import server_env_paths, unreachable
from gpulease.singleuser import SERVER_SCRIPT

ROOT = Path(__file__).resolve().parents[2]


@cache
def hub_python() -> tuple[str, str]:
    """(the interpreter to run `gpulease up` with, why per-user accounts cannot work ('' if they can))."""
    if os.geteuid() != 0:
        return sys.executable, "the tests do not run as root"
    if not unreachable(server_env_paths([None])):
        return sys.executable, ""
    key = hashlib.sha256(f"{ROOT}|{sys.prefix}".encode()).hexdigest()[:10]
    try:
        return str(server_env.build(Path(tempfile.gettempdir()) / f"gpulease-server-env-{key}")), ""
    except server_env.ServerEnvError as e:
        return sys.executable, str(e)


SHARED = Path(tempfile.gettempdir()) / "gpulease-e2e"


def shared_tmpdir(prefix: str) -> Path:
    """A fresh folder that per-user accounts can pass through (mode 0711), outside pytest's.

    pytest makes its temporary root 0700 again each time a session starts,
    so a folder under it that other accounts reach can vanish for them in the
    middle of a run when another session starts. Folders older than a day
    are removed here.
    """
    SHARED.mkdir(mode=0o711, exist_ok=True)
    SHARED.chmod(0o711)
    cutoff = time.time() - 86400
    for old in SHARED.iterdir():
        try:
            if old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=SHARED))
    folder.chmod(0o711)
    return folder


def relocate_state(state: Path) -> Path:
    """The state folder moved where per-user accounts can reach it; `state` becomes a link to it.

    Returns the real folder, for the hub (which resolves links) and for tests
    that compare paths the servers see.
    """
    if state.is_symlink() or SHARED.resolve() in state.resolve().parents:
        return state.resolve()  # moved already (a restarted hub keeps its folder)
    real = shared_tmpdir("state-") / "state"
    if state.exists():
        shutil.move(str(state), str(real))
    else:
        real.mkdir()
    state.parent.mkdir(parents=True, exist_ok=True)
    state.symlink_to(real, target_is_directory=True)
    return real


def why_not_isolated() -> str:
    """Why this host cannot run servers as per-user accounts ('' when it can)."""
    if os.geteuid() != 0:
        return "per-user accounts and cgroups need the hub to run as root (CI runs as root)"
    return hub_python()[1]


def why_no_sandbox() -> str:
    """Why this host cannot run each server in its sandbox ('' when it can)."""
    import shutil

    return why_not_isolated() or ("" if shutil.which("nft") else
                                  "nft is missing (Debian: apt-get install nftables)")


def isolation_gate(sandbox: bool = False):
    """`pytestmark` and an autouse fixture for the tests that run as per-user accounts
    (and, with `sandbox`, in each server's sandbox).

    Elsewhere they skip, saying why; under CI=true as root (where they must
    run) a host that cannot run them fails them instead.
    """
    import pytest

    why = why_no_sandbox() if sandbox else why_not_isolated()
    must_run = os.geteuid() == 0 and os.environ.get("CI", "").lower() == "true"
    marks = [pytest.mark.e2e, pytest.mark.skipif(bool(why) and not must_run, reason=why or "-")]

    @pytest.fixture(autouse=True)
    def _runs_where_it_must():
        if why:
            pytest.fail(f"CI=true as root, but the isolation tests cannot run: {why}")

    return marks, _runs_where_it_must


def mock_server_catalog(base: Path) -> Path:
    """A catalog (written in `base`) whose one image, `mock`, runs JupyterHub's mock
    single-user server: servers that start in milliseconds. As root the servers run
    as per-user accounts, so its env lives where they can reach it."""
    import yaml

    python, no_accounts = hub_python()
    env = (base if no_accounts else shared_tmpdir("mockenv-")) / "mockenv"
    (env / "bin").mkdir(parents=True)
    script = env / "bin" / SERVER_SCRIPT
    script.write_text(f"#!/bin/sh\nexec {python} -m jupyterhub.tests.mocksu \"$@\"\n")
    script.chmod(0o755)
    catalog = base / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"images": [
        {"name": "mock", "image": "example.org/mock:1", "description": "mock server",
         "local_env": str(env)}]}))
    return catalog


# Every test hub's id (private/hub_id): the suite's hubs take turns with the same user
# names (alice, bob), so as far as Unix accounts go they are one hub started again, as
# one lab's hub is. A test of another hub's account makes one recording another id.
TEST_HUB_ID = "9e57ab1e9e57ab1e"


def seed_hub_id(state: Path) -> None:
    """The test hubs' shared id, where the state folder has none yet. As root, accounts an
    earlier run's test hubs made before hub ids (their homes under SHARED, so never a real
    hub's) are made over to it, as GPULeaseHub.adopt_unmarked_accounts would."""
    private = state / "private"
    private.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = private / "hub_id"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(TEST_HUB_ID + "\n")
    if os.geteuid() == 0:
        _mark_test_accounts()


def _mark_test_accounts() -> None:
    import pwd

    from gpulease.host.unix_accounts import gecos, gecos_owner
    for entry in pwd.getpwall():
        owner = gecos_owner(entry.pw_gecos)
        if (owner is not None and owner[1] == "" and 61000 <= entry.pw_uid <= 64999
                and Path(entry.pw_dir).is_relative_to(SHARED)):
            subprocess.run(["usermod", "--comment", gecos(owner[0], TEST_HUB_ID),
                            entry.pw_name], capture_output=True, timeout=30)
