"""Which GPU nodes are a device's own, and which holders of them are tenant code."""

from gpulease.spawners.local.device_holders import exclusive_nodes, is_tenant


def test_a_mig_parent_node_is_shared_its_capabilities_are_its_own():
    mapping = {"GPU-a": ["/dev/nvidia0"],
               "MIG-1": ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"],
               "MIG-2": ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"],
               "GPU-b": ["/dev/nvidia1"]}
    assert exclusive_nodes(mapping["MIG-1"], mapping, ["MIG-1"]) == (
        "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13")
    assert exclusive_nodes(mapping["GPU-b"], mapping, ["GPU-b"]) == ("/dev/nvidia1",)
    both = [*mapping["MIG-1"], *mapping["MIG-2"]]
    assert "/dev/nvidia0" not in exclusive_nodes(both, mapping, ["MIG-1", "MIG-2"])


def test_only_tenant_code_is_ended():
    server = "5:devices:/gpulease/gl-mal._.1234abcd\n4:memory:/gpulease/gl-mal._.1234abcd\n"
    scope = "0::/system.slice/gpulease-gl-eve.g.1234abcd.scope\n"
    assert is_tenant(1001, "0::/\n", leaving_uid=1001)  # the stopped server's account
    assert is_tenant(1002, server, leaving_uid=1001)  # another tenant's server
    assert is_tenant(1002, scope, leaving_uid=1001)
    assert not is_tenant(0, server, leaving_uid=0)  # the hub, NVML, DCGM
    assert not is_tenant(998, "0::/system.slice/nvidia-persistenced.service\n", leaving_uid=1001)
