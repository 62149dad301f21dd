"""The kernel's side of the server sandboxes' network: bridge, namespaces, nftables.

A thin adapter over netlink (pyroute2) and `nft -f` (one transaction); the
addresses, names and rules are gpulease.core.policy.sandbox_net's. Everything
here needs root and runs in a thread, never on the hub's event loop.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import ipaddress
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpulease.core.policy.sandbox_net import (
    BRIDGE_PREFIX,
    FORWARD_GUARD_TABLE,
    SandboxNet,
    choose_subnet,
    forward_guard_ruleset,
    index_of,
)

NETNS_DIR = Path("/run/netns")  # where `ip netns` keeps named namespaces: admins see ours
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
LOCK_FILE = Path("/run/gpulease-sandbox.lock")
NFT = "nft"
CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MS_REC = 16384
MS_SHARED = 1 << 20
MNT_DETACH = 2


class NetnsError(OSError):
    """The host cannot make or remove a server's network."""


def _ipr():
    from pyroute2 import IPRoute

    return IPRoute()


@contextmanager
def host_lock() -> Iterator[None]:
    """Two hubs starting at once must not take the same /24."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def setup_bridge(tag: str, pool: str) -> SandboxNet:
    """The hub's bridge, made or found (a hub restarted after a crash keeps its /24,
    and so its running servers' addresses), up, with the host's address on it."""
    with host_lock(), _ipr() as ipr:
        bridge = f"{BRIDGE_PREFIX}{tag}"
        found = ipr.link_lookup(ifname=bridge)
        own = None
        if found:
            for a in ipr.get_addr(index=found[0], family=2):
                own = f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}"
        in_use = [f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}"
                  for a in ipr.get_addr(family=2)]
        in_use += [f"{r.get_attr('RTA_DST')}/{r['dst_len']}" for r in ipr.get_routes(family=2)
                   if r.get_attr("RTA_DST") and r["dst_len"] > 0]
        own_net = str(ipaddress.ip_interface(own).network) if own else None
        net = SandboxNet(tag, choose_subnet(pool, in_use, own_net))
        if not found:
            ipr.link("add", ifname=bridge, kind="bridge")
            found = ipr.link_lookup(ifname=bridge)
        index = found[0]
        if not own:
            ipr.addr("add", index=index, address=net.host_address, prefixlen=net.prefixlen)
        ipr.link("set", index=index, state="up")
    return net


def remove_bridge(net: SandboxNet) -> None:
    with _ipr() as ipr:
        found = ipr.link_lookup(ifname=net.bridge)
        if found:
            ipr.link("del", index=found[0])


def host_addresses() -> list[str]:
    """The host's own IPv4 addresses, each as a /32."""
    with _ipr() as ipr:
        return [f"{a.get_attr('IFA_ADDRESS')}/32" for a in ipr.get_addr(family=2)]


def own_mount_point(folder: Path = NETNS_DIR) -> None:
    """`folder` made a shared mount point of its own before a namespace is named in it,
    as `ip netns add` makes /run/netns (iproute2's netns_add): else the first `ip netns
    add` on the box (an admin's, another tool's) binds the folder onto itself over the
    names already there, and those can no longer be removed (unlink: EBUSY) nor their
    namespaces freed."""
    folder.mkdir(parents=True, exist_ok=True)
    libc = ctypes.CDLL(None, use_errno=True)
    where = str(folder).encode()
    if libc.mount(b"none", where, b"none", MS_SHARED | MS_REC, None) == 0:
        return  # a mount point already (ours, or ip's): shared, as ip leaves it
    err = ctypes.get_errno()
    if err != errno.EINVAL:  # EINVAL: no mount point yet
        raise OSError(err, f"share {folder}: {os.strerror(err)}")
    _ok(libc.mount(where, where, b"none", MS_BIND | MS_REC, None), f"make {folder} a mount point")
    _ok(libc.mount(b"none", where, b"none", MS_SHARED | MS_REC, None), f"share {folder}")


def netns_path(name: str) -> Path:
    return NETNS_DIR / name


def create_netns(net: SandboxNet, index: int) -> Path:
    """A server's namespace, ready: lo up, its veth on the bridge as an isolated port,
    its address and a default route through the host.

    Made by a thread of its own that enters the new namespace and comes back (a
    network namespace is per thread): no fork of the hub (pyroute2's netns.create
    forks, and a fork of a threaded hub is a copy of it that may run its exit
    handlers), and the thread ends even if it could not come back.
    """
    name = net.netns_name(index)
    failure: list[BaseException] = []
    worker = threading.Thread(target=_make_in_thread, args=(net, index, failure),
                              name=f"gpulease-netns-{name}", daemon=True)
    worker.start()
    worker.join()
    if failure:
        remove_netns(name)
        raise NetnsError(errno.EIO, f"cannot make the network namespace {name}: "
                                    f"{failure[0]}") from None
    return netns_path(name)


def _make_in_thread(net: SandboxNet, index: int, failure: list[BaseException]) -> None:
    name, veth = net.netns_name(index), net.veth(index)
    path = netns_path(name)
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        own_mount_point()
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDONLY | os.O_CLOEXEC, 0o444))
        _ok(libc.unshare(CLONE_NEWNET), "unshare")
        _ok(libc.mount(b"/proc/thread-self/ns/net", str(path).encode(), None, MS_BIND, None),
            "name it")
        with _ipr() as inside:
            inside.link("set", index=inside.link_lookup(ifname="lo")[0], state="up")
        _ok(libc.setns(home, CLONE_NEWNET), "come back")
        ns = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with _ipr() as ipr:
                stale = ipr.link_lookup(ifname=veth)
                if stale:  # a namespace torn down a moment ago: its pair is going
                    ipr.link("del", index=stale[0])
                ipr.link("add", ifname=veth, kind="veth",
                         peer={"ifname": "eth0", "net_ns_fd": ns})
                host_end = ipr.link_lookup(ifname=veth)[0]
                bridge = ipr.link_lookup(ifname=net.bridge)[0]
                ipr.link("set", index=host_end, master=bridge)
                # No frame from one server's port to another's: only to the bridge (host).
                ipr.brport("set", index=host_end, isolated=1)
                ipr.link("set", index=host_end, state="up")
            _ok(libc.setns(ns, CLONE_NEWNET), "enter it")
            with _ipr() as inside:
                eth0 = inside.link_lookup(ifname="eth0")[0]
                inside.addr("add", index=eth0, address=net.address(index),
                            prefixlen=net.prefixlen)
                inside.link("set", index=eth0, state="up")
                inside.route("add", dst="0.0.0.0/0", gateway=net.host_address)
            _ok(libc.setns(home, CLONE_NEWNET), "come back")
        finally:
            os.close(ns)
    except BaseException as e:  # told to the caller; this thread ends here either way
        failure.append(e)
    finally:
        os.close(home)


def _ok(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def remove_netns(name: str) -> None:
    """Drop the namespace's name; the kernel frees it (and its veth pair) once no
    process of it is left."""
    path = netns_path(name)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2(str(path).encode(), MNT_DETACH)
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def own_namespaces(tag: str) -> dict[int, str]:
    """This hub's named namespaces: number -> name."""
    try:
        names = os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return {}
    out = {}
    for name in names:
        index = index_of(name, tag)
        if index is not None:
            out[index] = name
    return out


def namespaces_in_use() -> set[tuple[int, int]]:
    """(device, inode) of every network namespace a process is in."""
    used = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                st = os.stat(f"/proc/{pid}/ns/net")
            except OSError:
                continue
            used.add((st.st_dev, st.st_ino))
    return used


def ns_identity(name: str) -> tuple[int, int] | None:
    try:
        st = os.stat(netns_path(name))
    except OSError:
        return None
    return st.st_dev, st.st_ino


def reconcile(tag: str) -> tuple[list[str], dict[int, str]]:
    """After a hub crash: the namespaces no process is in are removed (with them their
    veths); those a server still runs in are kept. (removed, kept)."""
    used = namespaces_in_use()
    removed, kept = [], {}
    for index, name in own_namespaces(tag).items():
        if ns_identity(name) in used:
            kept[index] = name
        else:
            remove_netns(name)
            removed.append(name)
    return removed, kept


def load_ruleset(text: str) -> None:
    """One nftables transaction: all of it, or nothing."""
    try:
        done = subprocess.run([NFT, "-f", "-"], input=text, capture_output=True, text=True,
                              timeout=30)
    except FileNotFoundError:
        raise NetnsError(errno.ENOENT, "nft is not installed (Debian: nftables)") from None
    if done.returncode != 0:
        raise NetnsError(errno.EIO, f"nft refused the rules: {done.stderr.strip()}")


def remove_table(table: str) -> None:
    subprocess.run([NFT, "delete", "table", "inet", table], capture_output=True, timeout=30)


def forwarding_on() -> bool:
    return IP_FORWARD.read_text().strip() == "1"


def turn_forwarding_on() -> None:
    """Host-wide IPv4 forwarding, for the servers' NAT; the guard table first, so that
    the host routes nothing but gpulease's bridges from the moment it is on."""
    load_ruleset(forward_guard_ruleset())
    IP_FORWARD.write_text("1\n")


def forwarding_off_if_last() -> None:
    """The last gpulease bridge went: forwarding gpulease turned on goes off again, and
    its guard with it (it would drop what Docker or libvirt forward, started later)."""
    with host_lock(), _ipr() as ipr:
        bridges = [link.get_attr("IFLA_IFNAME") for link in ipr.get_links()
                   if (link.get_attr("IFLA_IFNAME") or "").startswith(BRIDGE_PREFIX)]
        if bridges or not guard_loaded():
            return
        IP_FORWARD.write_text("0\n")
        remove_table(FORWARD_GUARD_TABLE)


def guard_loaded() -> bool:
    done = subprocess.run([NFT, "list", "table", "inet", FORWARD_GUARD_TABLE],
                          capture_output=True, timeout=30)
    return done.returncode == 0
