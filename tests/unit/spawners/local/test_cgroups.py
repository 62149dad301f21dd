"""Limits and devices: mechanism detection, cgroup settings from a profile, device maps, env (pure)."""

from __future__ import annotations

import itertools
import re
from decimal import Decimal

import pytest

from gpulease.spawners.local.cgroups import (
    HostFacts,
    Limits,
    choose_mechanism,
    cpu_quota_us,
    parse_mounts,
    plan_v1,
    plan_v2,
    systemd_command,
    unit_name,
)
from gpulease.spawners.local.devices import (
    BASIC_DEVICES,
    DeviceRule,
    mig_cap_files,
    node_paths,
    nvml_device_map,
    parse_cap_minor,
    rules_for,
)
from gpulease.spawners.local.process_spec import filter_server_env

MOUNTS_V1 = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/devices cgroup rw,relatime,devices 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""


def test_parse_mounts_finds_v1_controllers_and_v2():
    v1, v2 = parse_mounts(MOUNTS_V1)
    assert v1["cpu"] == v1["cpuacct"] == "/sys/fs/cgroup/cpu,cpuacct"
    assert v1["memory"] == "/sys/fs/cgroup/memory" and v2 == "/sys/fs/cgroup/unified"


def v1_host(**kw) -> HostFacts:
    v1, v2 = parse_mounts(MOUNTS_V1)
    base = dict(is_root=True, pid1="process_api", v1=v1, v2=v2,
                v2_controllers=frozenset({"hugetlb"}), writable=frozenset(v1.values()))
    return HostFacts(**{**base, **kw})


def test_v1_is_chosen_when_v2_has_no_memory_and_cpu_controllers():
    mech = choose_mechanism(v1_host())
    assert (mech.kind, mech.devices) == ("cgroup1", True)
    assert "enforced by cgroup1" in mech.describe()


def test_systemd_first_then_v2_then_v1_else_none():
    assert choose_mechanism(v1_host(pid1="systemd", systemd_run="/usr/bin/systemd-run")).kind \
        == "systemd"
    v2 = HostFacts(is_root=True, pid1="init", v2="/sys/fs/cgroup",
                   v2_controllers=frozenset({"memory", "cpu", "io"}),
                   writable=frozenset({"/sys/fs/cgroup"}))
    mech = choose_mechanism(v2)
    assert (mech.kind, mech.devices) == ("cgroup2", False)
    assert "NOT restricted" in mech.describe()
    none = choose_mechanism(HostFacts(is_root=True, pid1="init"))
    assert none.kind == "none" and "not enforced on this host" in none.describe()
    assert choose_mechanism(v1_host(is_root=False)).detail == "the hub does not run as root"
    assert choose_mechanism(v1_host(writable=frozenset())).kind == "none"


def test_a_chosen_mechanism_is_kept_to_or_refused():
    assert choose_mechanism(v1_host(), "none").kind == "none"
    assert choose_mechanism(v1_host(), "cgroup2").kind == "none"
    with pytest.raises(ValueError, match="resource_limits must be one of"):
        choose_mechanism(v1_host(), "docker")


def limits(**kw) -> Limits:
    base = dict(memory_bytes=256 * 2**20, cpu=Decimal("1.5"),
                devices=rules_for([("c", 195, 0)]), device_paths=("/dev/nvidia0",))
    return Limits(**{**base, **kw})


def test_v1_plan_writes_the_profile_and_closes_devices():
    v1, _ = parse_mounts(MOUNTS_V1)
    plan = plan_v1(v1, "gl-ada-default-x", limits(), devices=True)
    assert plan.dirs == ("/sys/fs/cgroup/memory/gpulease/gl-ada-default-x",
                         "/sys/fs/cgroup/cpu,cpuacct/gpulease/gl-ada-default-x",
                         "/sys/fs/cgroup/devices/gpulease/gl-ada-default-x")
    writes = [(w.path.rsplit("/", 1)[1], w.value) for w in plan.writes]
    assert ("memory.limit_in_bytes", str(256 * 2**20)) in writes
    assert ("memory.memsw.limit_in_bytes", str(256 * 2**20)) in writes
    assert ("cpu.cfs_quota_us", "150000") in writes and ("cpu.cfs_period_us", "100000") in writes
    allow = [v for f, v in writes if f == "devices.allow"]
    deny_at = writes.index(("devices.deny", "a"))
    assert deny_at < writes.index(("devices.allow", "c 1:3 rwm"))  # deny all, then allow
    assert "c 195:0 rw" in allow and not any(v.startswith("c 195:1 ") for v in allow)
    no_dev = plan_v1(v1, "u", limits(), devices=False)
    assert not any("devices" in w.path for w in no_dev.writes)


def test_v2_plan_and_systemd_command():
    plan = plan_v2("/sys/fs/cgroup", "u", limits())
    values = {w.path: w.value for w in plan.writes}
    assert values["/sys/fs/cgroup/gpulease/u/memory.max"] == str(256 * 2**20)
    assert values["/sys/fs/cgroup/gpulease/u/cpu.max"] == "150000 100000"
    assert values["/sys/fs/cgroup/gpulease/u/memory.swap.max"] == "0"
    cmd = systemd_command("gpulease-u", limits(), 61001, 61001)
    assert cmd[:3] == ["systemd-run", "--scope", "--quiet"] and cmd[-1] == "--"
    assert "CPUQuota=150%" in cmd and "DevicePolicy=closed" in cmd
    assert "DeviceAllow=/dev/nvidia0 rw" in cmd and "--uid=61001" in cmd


def test_units_and_quota():
    assert unit_name("gl-ada", "", "ab12") == "gl-ada._.ab12"
    assert unit_name("gl-ada", "my server/1", "t") == "gl-ada.my_20server_2f1.t"
    assert cpu_quota_us(Decimal("0.5")) == 50000 and cpu_quota_us(Decimal("0.001")) == 1000


# systemd's unit name alphabet (unit-name.c VALID_CHARS), without '@' (templates)
UNIT_CHARS = re.compile(r"^[A-Za-z0-9:_.\\-]+$")


def _names() -> list[str]:
    """Valid user names (gpulease/core/policy/user_names.py) built from pieces that collide when joined with '-'."""
    parts = ["a", "ab", "c", "ab-c", "c-default", "default", "d", "x1", "b-c-d", "z" * 30]
    names = set(parts)
    for x, y in itertools.product(parts, repeat=2):
        names.add(f"{x}-{y}"[:32].rstrip("-"))
    return sorted(n for n in names if USER_NAME.match(n))


USER_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$")


def test_unit_names_are_unambiguous_for_every_user_and_server():
    """User `ab` + server `c-default` and user `ab-c`'s default server were one name."""
    users = [f"gl-{n}" for n in _names()]
    servers = sorted({"", "default", "_", "c", "c-default", "x.y", "x_2ey", "Gpu", "ü", "a/b",
                      *(n for n in _names() if len(n) <= 30)})
    seen: dict[str, tuple[str, str]] = {}
    for user, server in itertools.product(users, servers):
        name = unit_name(user, server, "0a1b2c3d")
        assert name not in seen, f"{(user, server)} and {seen[name]} share {name}"
        seen[name] = (user, server)
        assert UNIT_CHARS.match(name) and "/" not in name and name not in (".", "..")
        assert len(f"gpulease-{name}.scope") <= 255 and len(name) <= 120
    assert len(seen) > 9_000
    assert unit_name("gl-ab", "c-default", "t") != unit_name("gl-ab-c", "", "t")
    assert unit_name("gl-ab", "default", "t") != unit_name("gl-ab", "", "t")
    assert unit_name("gl-ab", "", "t1") != unit_name("gl-ab", "", "t2")  # two hubs


def test_long_names_are_cut_with_a_hash_and_stay_apart():
    long_a, long_b = "s" * 200, "s" * 199 + "t"
    a, b = unit_name("gl-ada", long_a, "t"), unit_name("gl-ada", long_b, "t")
    assert a != b and len(a) <= 120 and len(b) <= 120 and a.startswith("gl-ada.")
    assert a.count(".") == 1  # unhashed names have two: a cut name is never one of them
    assert unit_name("gl-ada", "s" * 40, "t").count(".") == 2


def test_device_rules_and_node_map():
    mapping = {"GPU-a": ["/dev/nvidia0"], "MIG-b": ["/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap12",
                                                    "/dev/nvidia-caps/nvidia-cap13"]}
    paths, unknown = node_paths(("MIG-b", "GPU-x"), mapping)
    assert paths == ("/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap12",
                     "/dev/nvidia-caps/nvidia-cap13")
    assert unknown == ("GPU-x",)
    rules = rules_for([("c", 195, 1), ("c", 195, 1)])
    assert rules[: len(BASIC_DEVICES)] == BASIC_DEVICES
    assert rules[len(BASIC_DEVICES):] == (DeviceRule("c", 195, 1, "rw"),)
    assert DeviceRule("c", 136, None, "rw").v1() == "c 136:* rw"
    assert parse_cap_minor("DeviceFileMinor: 12\nDeviceFileMode: 292\n") == 12
    assert parse_cap_minor("nothing") is None
    assert mig_cap_files(0, 3, 0) == ("/proc/driver/nvidia/capabilities/gpu0/mig/gi3/access",
                                      "/proc/driver/nvidia/capabilities/gpu0/mig/gi3/ci0/access")


class FakeNVML:
    """Two GPUs: minor 0 full, minor 1 in MIG mode with one device (gi 3, ci 0)."""

    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlDeviceGetCount(self): return 2
    def nvmlDeviceGetHandleByIndex(self, i): return ("gpu", i)
    def nvmlDeviceGetMinorNumber(self, h): return h[1]
    def nvmlDeviceGetUUID(self, h): return f"GPU-{h[1]}" if h[0] == "gpu" else "MIG-x"
    def nvmlDeviceGetMigMode(self, h): return (h[1], h[1])
    def nvmlDeviceGetMaxMigDeviceCount(self, h): return 2

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, slot):
        if slot:
            raise RuntimeError("empty slot")
        return ("mig", 0)

    def nvmlDeviceGetGpuInstanceId(self, h): return 3
    def nvmlDeviceGetComputeInstanceId(self, h): return 0


def test_nvml_map_gives_gpu_nodes_and_mig_capabilities():
    files = {"/proc/driver/nvidia/capabilities/gpu1/mig/gi3/access": "DeviceFileMinor: 30",
             "/proc/driver/nvidia/capabilities/gpu1/mig/gi3/ci0/access": "DeviceFileMinor: 31"}
    got = nvml_device_map(FakeNVML(), read=files.__getitem__)
    assert got == {"GPU-0": ["/dev/nvidia0"], "GPU-1": ["/dev/nvidia1"],
                   "MIG-x": ["/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap30",
                             "/dev/nvidia-caps/nvidia-cap31"]}


def test_server_env_drops_hub_secrets_by_name_and_value():
    env = {"PATH": "/usr/bin", "JUPYTERHUB_API_TOKEN": "own-token", "CONFIGPROXY_AUTH_TOKEN": "p",
           "SNEAKY": "prefix-cookiesecret123-suffix", "HOME": "/h"}
    out = filter_server_env(env, ("CONFIGPROXY_AUTH_TOKEN",), {"cookiesecret123"})
    assert out == {"PATH": "/usr/bin", "JUPYTERHUB_API_TOKEN": "own-token", "HOME": "/h"}
