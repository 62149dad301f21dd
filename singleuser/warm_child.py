"""A server forked by the warm launcher: it becomes the researcher's, then runs the server.

What a cold start gets from Popen and gpulease.spawners.local.isolation.preexec_for,
in the same order, before anything of the researcher's can run (their
~/.jupyter config, their user-site packages and the kernels come later):

1. signals as a new program has them; its output (the write end of its own log's
   pipe, sent by the hub with the request socket; /dev/null if none was) on its
   stdout and stderr, never the launcher's, which are the hub's; every other
   descriptor of the launcher closed but stdin and its own request socket;
2. its request read (JSON to EOF: argv, env, cwd, uid, gid, groups, cgroup folders,
   sandbox);
3. a new session (start_new_session), the server's cgroups joined and its sandbox
   entered while root (gpulease.singleuser.sandbox; then the moment is told to the
   hub: its billing starts there), groups set to
   the account's own (never the launcher's), gid, then uid;
4. the server's folder as the working directory;
5. "ready" sent to the hub and the request socket closed while the process is
   still undumpable (a uid change makes it so): no process of the researcher's
   can ptrace it and reach that socket. The hub knows the child's pid from the
   launcher, not from the child. Only then is it made dumpable again, as an
   exec would (the researcher may look at their own server);
6. exactly the request's environment (the devices' CUDA_VISIBLE_DEVICES
   among it), its argv, and the interpreter's path as the script would have it;
   /proc/PID/cmdline and environ show them too (proc_title.py).

Where the warm image could differ from a cold start — an environment variable
read at import time that differs from the launcher's, a researcher's
user-site package shadowing a module the launcher imported, a .pth file to
run — the child execs the cold command instead, as the same process in the
same cgroup and account: the researcher gets what a cold start gives.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import site
import sys
import time

from gpulease.singleuser import proc_title, sandbox

# Read by the interpreter or by modules the launcher imported, as they start or are
# imported: a server whose request sets them otherwise is started cold.
IMPORT_TIME_ENV = ("JUPYTERHUB_SINGLEUSER_APP", "JUPYTERHUB_SINGLEUSER_EXTENSION",
                   "LANG", "LC_ALL", "LC_CTYPE")  # the locale: stdio's encoding


class SetupError(Exception):
    """The child could not become the server it was asked to be (told to the hub)."""


# Modules the launcher imports that keep, from their import, the account or home of
# whoever imported them (root, HOME=/nonexistent): imported again once the child is
# the researcher. send2trash keeps the importer's uid and home; JupyterLab's LabApp
# computes its user_settings_dir and workspaces_dir defaults from HOME as the class
# is defined (kept, a warm server's JupyterLab could save no setting or workspace:
# 500, "Permission denied: '/nonexistent'"). jupyterlab's extension point imports
# LabApp from jupyterlab.labapp when the server starts, so it gets the new class.
# tests/integration/host/test_warm_start.py looks for any other such module or class default.
REIMPORT_AS_RESEARCHER = ("send2trash.plat_other", "jupyterlab.labapp")


def run_server(request_fd: int, output_fd: int = -1) -> int:
    launcher_env = dict(os.environ)
    _fresh_signals()
    try:
        _take_output(output_fd)
        _close_other_descriptors(request_fd)
        request = _read_request(request_fd)
        # what /proc/PID/cmdline and environ are to show: as exec'ing the script gives
        title = proc_title.as_bytes([sys.executable, *request["argv"]], request["env"])
        _become(request, title, request_fd)
    except (SetupError, OSError, ValueError, KeyError, TypeError) as e:
        _say(request_fd, {"error": str(e) or type(e).__name__})
        os._exit(1)  # nothing of the server ran: no cleanup of the launcher's to do
    # Told and closed while still undumpable (the uid change made it so): nothing of
    # the researcher's can reach this socket, by ptrace or otherwise.
    if not _say(request_fd, {"ready": True}):
        os._exit(1)  # the hub gave up on this start: it is not to run
    os.close(request_fd)
    if request.get("uid") is not None:
        _dumpable_again()
    argv, env = list(request["argv"]), dict(request["env"])
    os.environ.clear()
    os.environ.update(env)
    try:
        proc_title.write(*title)
        proc_title.name(argv[0])
    except (OSError, ValueError, IndexError):
        pass  # /proc shows the launcher's: cosmetic, never a reason to fail the server
    sys.argv = argv
    if sys.path:
        sys.path[0] = os.path.dirname(argv[0])  # where a script's interpreter puts it
    cold = _why_cold(env, launcher_env)
    if cold:
        _note(f"starting cold: {cold}")
        os.execve(argv[0], argv, env)
    for name in REIMPORT_AS_RESEARCHER:
        if name in sys.modules:
            importlib.reload(sys.modules[name])
    from gpulease.singleuser.launch import main

    return main()


def _fresh_signals() -> None:
    """Signal dispositions and mask as a new Python program has them. The launcher's
    are its starter's: a hub started in the background has SIGINT ignored until
    JupyterHub handles it, and exec keeps an ignored signal ignored, so a server
    forked from a launcher started then would ignore the hub's SIGINT (a cold
    start, exec'd later, does not)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for number in range(1, signal.NSIG):
        if number in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(number, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # the real-time signals the C library keeps for itself
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for ignored in ("SIGPIPE", "SIGXFSZ"):  # as the interpreter sets them at start
        if hasattr(signal, ignored):
            signal.signal(getattr(signal, ignored), signal.SIG_IGN)


def _take_output(output_fd: int) -> None:
    """`output_fd` (else /dev/null) as stdout and stderr, in place of the launcher's: the
    hub's own, which no server may write to or truncate."""
    if output_fd < 0:
        output_fd = os.open(os.devnull, os.O_WRONLY)
    for target in (1, 2):
        os.dup2(output_fd, target)
    os.close(output_fd)


def _close_other_descriptors(keep: int) -> None:
    """Close every descriptor but stdio and `keep`: those open, as /proc lists them
    (closing every possible number costs seconds where close_range is missing and
    the limit is high); every number up to the limit where /proc cannot say."""
    try:
        open_now = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        os.closerange(3, keep)
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        return
    for fd in open_now:
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, closed already


def _read_request(fd: int) -> dict:
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    request = json.loads(b"".join(chunks))
    if not isinstance(request, dict) or not request.get("argv"):
        raise SetupError("the request names no command")
    return request


def _become(request: dict, title: tuple[bytes, bytes], request_fd: int) -> None:
    os.setsid()
    for folder in request.get("cgroup_dirs") or ():
        try:
            with open(f"{folder}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:
            raise SetupError(f"cannot join the server's cgroup {folder}: {e}") from None
    if request.get("sandbox"):  # still root: its network, IPC, /dev/shm, /tmp and /proc
        try:
            sandbox.enter(request["sandbox"])
        except (OSError, KeyError, ValueError) as e:
            raise SetupError(f"cannot enter the server's sandbox: {e}") from None
    # In its cgroup, with its devices, still root: the researcher's code may run from
    # here on, and so the server is billed from here (the hub takes this moment).
    _say(request_fd, {"in_cgroup": time.time()})
    try:  # while root: the ends of /proc/PID/cmdline and environ (proc_title.py)
        fitted = proc_title.fit(*title)
    except (OSError, ValueError, IndexError):
        fitted = False
    if not fitted:  # they then read as the launcher's room, padded with NULs
        _note("/proc/PID/cmdline and environ of this server keep the warm launcher's "
              "length (PR_SET_MM needs CAP_SYS_RESOURCE)")
    uid, gid, groups = request.get("uid"), request.get("gid"), request.get("groups")
    try:
        if groups is not None:
            os.setgroups([int(g) for g in groups])
        if gid is not None:
            os.setgid(int(gid))
        if uid is not None:
            os.setuid(int(uid))
    except OSError as e:
        raise SetupError(f"cannot become uid {uid} gid {gid} groups {groups}: "
                         f"{e.strerror}") from None
    if uid is not None and (os.getuid() != uid or os.geteuid() != uid
                            or (0 in os.getgroups() and gid != 0)):
        raise SetupError(f"could not drop to uid {uid}")
    try:
        os.chdir(request["cwd"])
    except OSError as e:
        raise SetupError(f"cannot enter the server's folder {request['cwd']}: "
                         f"{e.strerror}") from None


def _dumpable_again() -> None:
    """Changing uid made the process undumpable, its /proc files root's: the researcher
    could not look at their own server (py-spy, /proc/PID/fd) as after a cold start,
    whose exec made it dumpable again. Nothing but the researcher's is in it by now."""
    import ctypes

    pr_set_dumpable = 4
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_dumpable, 1, 0, 0, 0) != 0:  # the server runs on, undumpable
        _note(f"prctl(PR_SET_DUMPABLE): {os.strerror(ctypes.get_errno())}")


def _why_cold(env: dict[str, str], launcher_env: dict[str, str]) -> str:
    """Why this server must start as a new program, or "" when the fork is exact."""
    for name in sorted({*env, *launcher_env}):
        if (name.startswith("PYTHON") or name in IMPORT_TIME_ENV) and \
                env.get(name) != launcher_env.get(name):
            return f"{name} differs from the warm launcher's"
    return _user_site_differs()


def _user_site_differs() -> str:
    """Put the researcher's user site on sys.path as a cold start would; or say why not."""
    if site.ENABLE_USER_SITE is False or sys.flags.no_user_site:
        return ""  # a venv without system site packages: a cold start has none either
    if not site.check_enableusersite():
        return ""
    site.USER_BASE = None  # computed from HOME, which is the researcher's now
    site.USER_SITE = None
    user_site = site.getusersitepackages()
    try:
        names = os.listdir(user_site)
    except OSError:
        return ""
    loaded = {m.partition(".")[0] for m in sys.modules}
    for name in names:
        if name.partition(".")[0] == "usercustomize":
            return f"{os.path.join(user_site, name)} would run as the server starts"
        stem = name.removesuffix(".py").partition(".")[0] if not name.endswith(".pth") else ""
        if name.endswith(".pth") or (stem in loaded and not name.endswith(".dist-info")):
            return f"{os.path.join(user_site, name)} would take part in the server's start"
    system = set(site.getsitepackages())
    at = next((i for i, p in enumerate(sys.path) if p in system), len(sys.path))
    sys.path.insert(at, user_site)
    return ""


def _say(fd: int, message: dict) -> bool:
    """Tell the hub; whether it could be told (a hub that gave up closed its end)."""
    try:
        os.write(fd, json.dumps(message).encode() + b"\n")
    except OSError:
        return False
    return True


def _note(message: str) -> None:
    """A line for the server's log, on its stderr (never a reason to fail)."""
    try:
        os.write(2, f"[gpulease] {message}\n".encode())
    except OSError:
        pass
