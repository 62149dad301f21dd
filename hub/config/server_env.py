"""The Python environment notebook servers run from, where per-user accounts can reach it.

As root, each server runs as its user's own Unix account, which must be able
to run the environment's interpreter and read its packages, gpulease's code
and Jupyter's data (share/, etc/). A clone under /root (mode 0700) makes
none of them reachable: its `.venv`, the packages in it and, with an
editable install, gpulease's code in the clone itself. `build` then makes a
copy of that environment in a folder every account can pass: a virtualenv of
an interpreter they can run (the same Python version) holding the same
packages, gpulease's code and Jupyter's data — hard links where the file
system allows (instant, no space), copies elsewhere. It mirrors: run again,
it brings over what changed (an edited source file, a package upgrade) and
drops what is gone, so each `gpulease up` serves the code of the clone.

`gpulease up` (gpulease.hub.app) keeps this copy in the state folder's
server-env/; the tests (tests/support/isolation_env.py) keep theirs in /tmp.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

from gpulease.host.unix_accounts import blocking_dir
from gpulease.singleuser import SERVER_SCRIPT

# Never part of an environment: a built labextension's npm tree, a repository.
SKIPPED = frozenset({"node_modules", ".git"})


class ServerEnvError(RuntimeError):
    """No environment the per-user accounts can run could be made."""


def version() -> str:
    return f"python{sys.version_info.major}.{sys.version_info.minor}"


def reachable_interpreter() -> str | None:
    """An interpreter of this Python version that every account can run, or None.

    This environment's own base interpreter when they can (the Makefile builds
    .venv with one: scripts/pick-python), else the system's.
    """
    candidates = [os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
                  f"/usr/bin/{version()}", f"/usr/local/bin/{version()}"]
    for candidate in candidates:
        real = os.path.realpath(candidate)
        if os.path.exists(real) and not blocking_dir(real, execute=True):
            return candidate
    return None


def editable_packages() -> dict[str, Path]:
    """gpulease's packages and their folders when it is installed editable (else {}).

    An editable install leaves the code in the source tree; its pyproject.toml
    says which folder is which subpackage, the one list of them.
    """
    import gpulease

    package_dir = Path(gpulease.__file__).resolve().parent
    if package_dir.parent == Path(sysconfig.get_paths()["purelib"]).resolve():
        return {}
    source = package_dir.parent
    with open(source / "pyproject.toml", "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {package: source / folder for package, folder in mapping.items()}


def build(target: Path) -> Path:
    """Make or refresh at `target` a copy of this environment that every account can run.

    Returns the copy's interpreter. `target`'s parents must already be
    passable by every account (the caller's folder: the state folder, /tmp).
    """
    python = reachable_interpreter()
    if python is None:
        raise ServerEnvError(
            f"no interpreter of this Python version ({version()}) that every account can run: "
            f"{sys.executable} is out of their reach and neither /usr/bin/{version()} nor "
            f"/usr/local/bin/{version()} exists (Debian: apt-get install {version()}-venv)")
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.with_name(f".{target.name}.lock")
    try:
        lock = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as e:  # a link left there (ELOOP)
        raise ServerEnvError(f"{lock_path}: {e.strerror}: the server environment is not made "
                             "through it (move it away)") from None
    old_umask = os.umask(0o022)  # what is made here is for every account to read
    try:
        _refuse_foreign(lock_path, os.fstat(lock))
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time (two hubs, two test workers)
        target.mkdir(mode=0o755, exist_ok=True)
        _refuse_foreign(target, target.lstat())
        _venv(python, target)
        site = target / "lib" / version() / "site-packages"
        editable = editable_packages()
        own_site = Path(sysconfig.get_paths()["purelib"])
        # The editable install's finder points into the source tree: the code is copied instead.
        _mirror(own_site, site, keep={"gpulease"} if editable else set(),
                skip_prefix="__editable__")
        for package, folder in sorted(editable.items()):
            children = {p.split(".")[-1] for p in editable if p.startswith(package + ".")
                        and p.count(".") == package.count(".") + 1}
            _mirror(folder, site.joinpath(*package.split(".")), keep=children)
        for data in ("share", "etc"):  # Jupyter's data (lab, kernels) and config (the extension)
            if (Path(sys.prefix) / data).is_dir():
                _mirror(Path(sys.prefix) / data, target / data)
        # The servers' script, and JupyterHub's own beside it as in any environment
        # with JupyterHub installed (an image's, a stock KubeSpawner's command).
        for script, module in ((SERVER_SCRIPT, "gpulease.singleuser.launch"),
                               ("jupyterhub-singleuser", "jupyterhub.singleuser")):
            _write_if_changed(target / "bin" / script,
                              f"#!{target / 'bin' / 'python'}\nimport sys\n"
                              f"from {module} import main\nsys.exit(main())\n", 0o755)
    finally:
        os.umask(old_umask)
        os.close(lock)
    return target / "bin" / "python"


def _refuse_foreign(path: Path, st: os.stat_result) -> None:
    """The copy's folder and lock must be this account's and no one else's to change.

    In a folder every account may write (the tests' /tmp), another account could
    make the copy's folder first and change the packages in it after `build`
    filled them: code that the hub, or every user's server, would then run.
    """
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        raise ServerEnvError(f"{path} is not a plain folder or file: the server environment is "
                             "not made through it (move it away)")
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ServerEnvError(
            f"{path} belongs to uid {st.st_uid} (mode {stat.S_IMODE(st.st_mode):o}), not to "
            f"this account (uid {os.geteuid()}) alone: whoever can change it could change the "
            "code the servers run; the server environment is not made there (move it away)")


def _venv(python: str, target: Path) -> None:
    """A bare virtualenv of `python` at `target` (made again when the interpreter changed)."""
    cfg = target / "pyvenv.cfg"
    home = f"home = {os.path.dirname(python)}"
    if cfg.exists() and home in cfg.read_text().splitlines():
        return
    subprocess.run([python, "-m", "venv", "--without-pip", "--clear", str(target)],
                   check=True, capture_output=True, timeout=120)
    for folder in (target, *target.rglob("*")):
        if folder.is_dir() and not folder.is_symlink():
            folder.chmod(0o755)


def _write_if_changed(path: Path, text: str, mode: int) -> None:
    if not path.exists() or path.read_text() != text:
        tmp = path.with_name(f".{path.name}.new")
        tmp.write_text(text)
        tmp.chmod(mode)
        os.replace(tmp, path)


def _mirror(source: Path, target: Path, keep: set[str] = frozenset(),
            skip_prefix: str | None = None) -> None:
    """Make `target` hold what `source` holds (links followed); `keep`: top-level names
    of `target` left alone (filled by another mirror), `skip_prefix`: top-level names not
    brought over."""
    for folder, dirs, files in os.walk(source, followlinks=True):
        rel = Path(folder).relative_to(source)
        here = target / rel
        top = rel == Path(".")
        wanted = {n for n in (*dirs, *files) if n not in SKIPPED
                  and not (top and (n in keep or (skip_prefix and n.startswith(skip_prefix))))}
        dirs[:] = [d for d in dirs if d in wanted]
        if here.is_symlink() or (here.exists() and not here.is_dir()):
            here.unlink()
        here.mkdir(mode=0o755, exist_ok=True)
        if stat.S_IMODE(here.stat().st_mode) != 0o755:
            here.chmod(0o755)
        for name in os.listdir(here):
            if name not in wanted and not (top and name in keep):
                gone = here / name
                if gone.is_dir() and not gone.is_symlink():
                    shutil.rmtree(gone)
                else:
                    gone.unlink()
        for name in files:
            if name in wanted:
                _sync_file(Path(folder) / name, here / name)


def _sync_file(source: Path, target: Path) -> None:
    # A link in the source (gpulease's hub/service/rest-api.yml points at
    # ../../docs/) is brought over as the file it names: link(2) would make a
    # hard link to the link itself, dangling in the copy.
    source = Path(os.path.realpath(source))
    try:
        src = source.stat()
    except FileNotFoundError:  # a dangling link
        return
    try:
        dst = target.lstat()
        if (dst.st_ino, dst.st_dev) == (src.st_ino, src.st_dev) or (
                stat.S_ISREG(dst.st_mode) and dst.st_size == src.st_size
                and dst.st_mtime_ns == src.st_mtime_ns):
            return
        if stat.S_ISDIR(dst.st_mode):
            shutil.rmtree(target)
    except FileNotFoundError:
        pass
    tmp = target.with_name(f".{target.name}.gl-new")
    tmp.unlink(missing_ok=True)
    readable = src.st_mode & stat.S_IROTH
    try:
        if not readable:
            raise OSError("copied, to be readable")
        os.link(source, tmp)
    except OSError:  # another file system, or a file only its owner may read
        shutil.copy2(source, tmp)
        mode = stat.S_IMODE(src.st_mode) | stat.S_IROTH | stat.S_IRGRP
        if mode & stat.S_IXUSR:
            mode |= stat.S_IXOTH | stat.S_IXGRP
        os.chmod(tmp, mode)
    os.replace(tmp, target)


def choose(configured: str, *, accounts: bool, state_root: Path) -> tuple[str, str]:
    """At `gpulease up`: (the environment of servers whose image names none, '' for
    gpulease's own; the start banner's line saying which and why).

    GPULeaseHub.server_env when set; else gpulease's own environment, unless per-user
    accounts cannot reach it: then its copy, refreshed now, in the state folder.
    """
    from gpulease.hub.config.isolation_check import server_env_paths, unreachable

    if configured:
        return configured, f"Server environment: {configured} (GPULeaseHub.server_env)"
    if not accounts or not unreachable(server_env_paths([None])):
        return "", f"Server environment: {sys.prefix} (gpulease's own)"
    target = state_root / "server-env"
    build(target)
    return str(target), (f"Server environment: {target}, a copy of {sys.prefix} (which the "
                         "per-user accounts cannot reach), refreshed at each start")
