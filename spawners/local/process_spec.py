"""Pure builder of a local notebook server's process: command, environment, folder.

Kept apart from the spawner (I/O) so that what a server gets — which devices,
which interpreter, which flags — is decided by one plain function and tested
without a hub, the way kubespawner's objects.py builds pods.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpulease.singleuser import SERVER_SCRIPT


@dataclass(frozen=True)
class ProcessSpec:
    cmd: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""


def singleuser_command(local_env: str | None, run_as_uid: int) -> tuple[str, ...]:
    """`gpulease-singleuser` of the image's local environment, else of gpulease's own.

    It is jupyterhub-singleuser's server, started without a 1.5 s parser
    build (gpulease.singleuser.launch); the environment must hold gpulease.

    As root the server refuses to start without --allow-root (and the hub then
    answers a bare 500 after its timeout), so it is added exactly when the
    server will run as uid 0.
    """
    bindir = Path(local_env) / "bin" if local_env else Path(sys.executable).parent
    cmd: list[str] = [str(bindir / SERVER_SCRIPT)]
    if run_as_uid == 0:
        cmd.append("--allow-root")
    return tuple(cmd)


def device_env(device_uuids: tuple[str, ...]) -> dict[str, str]:
    """Expose exactly the placed devices; a CPU-only server sees no GPU at all.

    CUDA_VISIBLE_DEVICES takes GPU and MIG UUIDs. An empty value hides every
    GPU from CUDA (unset would show them all). NVIDIA_VISIBLE_DEVICES is read
    by the NVIDIA container runtime when a local env is a container wrapper.
    """
    if not device_uuids:
        return {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}
    joined = ",".join(device_uuids)
    return {"CUDA_VISIBLE_DEVICES": joined, "NVIDIA_VISIBLE_DEVICES": joined}


def build_process_spec(
    *,
    user: str,
    home: Path,
    device_uuids: tuple[str, ...],
    local_env: str | None,
    run_as_uid: int,
    profile_slug: str,
    image_name: str,
    unix_user: str = "",
) -> ProcessSpec:
    """`unix_user`: the account the server runs as, when it is not named like the hub user."""
    env = {
        "HOME": str(home),
        "USER": unix_user or user,
        "LOGNAME": unix_user or user,
        "SHELL": "/bin/bash",
        "GPULEASE_PROFILE": profile_slug,
        "GPULEASE_IMAGE": image_name,
        **device_env(device_uuids),
    }
    return ProcessSpec(cmd=singleuser_command(local_env, run_as_uid), env=env, cwd=str(home))


def filter_server_env(env: dict[str, str], secret_names: tuple[str, ...],
                      secret_values: set[str]) -> dict[str, str]:
    """The server's environment without any of the hub's secrets.

    JupyterHub already passes only `env_keep` from the hub's own environment;
    this is the last check, by name and by value, so that a secret reaching
    the spawner some other way (a config's `environment`, an inherited
    variable) still stays out of a notebook's `os.environ`.
    """
    return {
        k: v for k, v in env.items()
        if k not in secret_names and not any(secret in v for secret in secret_values)
    }


def why_not_warm(*, enabled: bool, shell_cmd: list[str], cmd_prefix: tuple[str, ...],
                 interpreter: str | None, env_problem: str = "") -> str:
    """Why a server must start as a new program rather than be forked warm; "" if it may be.

    A fork runs the server's Python in-process, so the script must be a Python
    script (not a container wrapper), run directly (not through a shell, not
    through systemd-run, which makes its scope around a new process).
    """
    if not enabled:
        return "warm starts are off (GPULeaseHub.warm_start)"
    if shell_cmd:
        return "the spawner runs servers through a shell (shell_cmd)"
    if cmd_prefix:
        return "systemd makes each server's scope around a new process (resource_limits)"
    if not interpreter or not Path(interpreter).name.startswith("python"):
        return "the server's command is not a Python script"
    return env_problem  # the environment's own files (warm_start.root_would_run_others_code)


def warm_request(*, argv: list[str], env: dict[str, str], cwd: str, uid: int | None,
                 gid: int | None, groups: list[int] | None,
                 cgroup_dirs: tuple[str, ...], sandbox: dict | None = None) -> dict:
    """What the warm launcher's child is asked to become (gpulease.singleuser.warm_child):
    the same command, environment, folder, account, cgroups and sandbox as a cold start's."""
    return {"argv": list(argv), "env": dict(env), "cwd": cwd, "uid": uid, "gid": gid,
            "groups": None if groups is None else list(groups),
            "cgroup_dirs": list(cgroup_dirs), "sandbox": sandbox}
