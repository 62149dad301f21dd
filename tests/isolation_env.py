"""A hub that runs as root needs a Python environment every per-user account can run.

On the build machines the project's virtualenv is readable by everyone but
its interpreter is pyenv's, under /root (mode 0700): no per-user account can
execute it, and `gpulease up` as root refuses to start, naming that folder
(gpulease.hub.isolation_check). Tests do what an admin would do: run the hub
from an environment every account can reach — here a virtualenv of the
system Python of the same version, in /tmp, that uses the project's
installed packages (a .pth file) and its Jupyter data and config (share/ and
etc/ linked), so that the servers are the same JupyterLab with the same
extensions. Nothing under /root is touched.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from functools import cache
from pathlib import Path

from gpulease.hub.isolation_check import server_env_paths, unreachable
from gpulease.hub.unix_accounts import blocking_dir

ROOT = Path(__file__).resolve().parent.parent


@cache
def hub_python() -> tuple[str, str]:
    """(the interpreter to run `gpulease up` with, why per-user accounts cannot work ('' if they can))."""
    if os.geteuid() != 0:
        return sys.executable, "the tests do not run as root"
    if not unreachable(server_env_paths([None])):
        return sys.executable, ""
    site_packages = sysconfig.get_paths()["purelib"]
    for what, path in (("the project", str(ROOT)), ("its packages", site_packages)):
        blocked = blocking_dir(os.path.realpath(path))
        if blocked:
            return sys.executable, (f"{what} ({path}) cannot be reached by other accounts: "
                                    f"{blocked[0]} is mode {blocked[1]:o}")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    system = next((p for p in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}")
                   if os.path.exists(p) and not blocking_dir(os.path.realpath(p), execute=True)),
                  None)
    if system is None:
        return sys.executable, (f"the interpreter {sys.executable} is not reachable by other "
                                f"accounts and no system python{version} is installed")
    return str(_build_env(system, site_packages)), ""


def _build_env(system_python: str, site_packages: str) -> Path:
    key = hashlib.sha256(f"{ROOT}|{sys.prefix}|{system_python}".encode()).hexdigest()[:10]
    env = Path(tempfile.gettempdir()) / f"gpulease-test-env-{key}"
    python = env / "bin" / "python"
    if (env / ".ready").exists():
        return python
    work = Path(tempfile.mkdtemp(prefix=f"{env.name}-", dir=env.parent))
    subprocess.run([system_python, "-m", "venv", "--without-pip", str(work)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (work / "lib" / version / "site-packages" / "gpulease_project.pth").write_text(
        f"import site; site.addsitedir({site_packages!r})\n")
    for name in ("share", "etc"):  # Jupyter's data (lab, kernels) and config (the extension)
        if (Path(sys.prefix) / name).exists():
            (work / name).symlink_to(Path(sys.prefix) / name)
    script = work / "bin" / "jupyterhub-singleuser"
    script.write_text(f"#!{env}/bin/python\nimport sys\nfrom jupyterhub.singleuser import main\n"
                      "sys.exit(main())\n")
    script.chmod(0o755)
    work.chmod(0o755)
    (work / ".ready").write_text("")
    try:
        work.rename(env)
    except OSError:  # another test session made it first
        shutil.rmtree(work, ignore_errors=True)
    return python


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


def isolation_gate():
    """`pytestmark` and an autouse fixture for the tests that run as per-user accounts.

    Elsewhere they skip, saying why; under CI=true as root (where they must
    run) a host that cannot run them fails them instead.
    """
    import pytest

    why = why_not_isolated()
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
    script = env / "bin" / "jupyterhub-singleuser"
    script.write_text(f"#!/bin/sh\nexec {python} -m jupyterhub.tests.mocksu \"$@\"\n")
    script.chmod(0o755)
    catalog = base / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"images": [
        {"name": "mock", "image": "example.org/mock:1", "description": "mock server",
         "local_env": str(env)}]}))
    return catalog
