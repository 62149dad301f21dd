import sys
from pathlib import Path

from gpulease.spawners.local.process_spec import build_process_spec, device_env, singleuser_command


def test_exactly_the_placed_devices_are_visible():
    env = device_env(("MIG-a", "MIG-b"))
    assert env["CUDA_VISIBLE_DEVICES"] == "MIG-a,MIG-b"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "MIG-a,MIG-b"


def test_cpu_only_server_sees_no_gpu():
    # an unset CUDA_VISIBLE_DEVICES would expose every GPU of the host
    env = device_env(())
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_allow_root_only_for_uid_0():
    assert "--allow-root" in singleuser_command(None, 0)
    assert "--allow-root" not in singleuser_command(None, 1000)


def test_local_env_interpreter_or_our_own():
    assert singleuser_command("/opt/envs/pytorch", 1000)[0] == "/opt/envs/pytorch/bin/gpulease-singleuser"
    assert singleuser_command(None, 1000)[0] == str(Path(sys.executable).parent / "gpulease-singleuser")


def test_spec_home_and_labels():
    spec = build_process_spec(user="alice", home=Path("/s/homes/alice"), device_uuids=("GPU-1",),
                              local_env=None, run_as_uid=1000, profile_slug="h200-full",
                              image_name="pytorch")
    assert spec.cwd == "/s/homes/alice"
    assert spec.env["HOME"] == "/s/homes/alice" and spec.env["USER"] == "alice"
    assert spec.env["GPULEASE_PROFILE"] == "h200-full"
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "GPU-1"
