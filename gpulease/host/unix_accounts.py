"""Per-user Unix accounts of the embedded shape (when the hub runs as root).

Each hub user's servers run as a Unix account of their own, so that the
kernel's uid — not a convention — keeps researchers out of each other's
homes, processes and the hub's private files. The decisions are pure
functions: the Unix name derived from the hub name (`unix_name`), the uid
(`choose_uid`, stable: the same name gets the same uid on every host unless
that uid is taken), whether an existing account is ours (`account_problem`:
made for this hub user by this hub, whose id its GECOS field records, `gecos`)
and whether a path is reachable by such an account (`blocking_dir`). The
adapter (`ensure_unix_account`) runs Debian's shadow tools (`groupadd`,
`useradd`).
"""

from __future__ import annotations

import grp
import hashlib
import logging
import os
import pwd
import re
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpulease.host.state import StateError, checked_home, open_home

MAX_UNIX_NAME = 32  # useradd's limit
# The account expired on 2 January 1970: PAM refuses every login of it (sshd with a key
# the user put in their home, cron, at, su), each of which would start processes outside
# the server's cgroup: no CPU, memory or device limits, no billing, and still there after
# the server stops. The hub's setuid (and systemd-run's) asks no PAM: servers still run.
EXPIRED = "1"
GECOS_MARK = "gpulease user "  # the GECOS field names the hub user: how we know an account is ours
HUB_MARK = " hub "  # ... and then the hub that made it (its id in private/hub_id)
_UNSAFE = re.compile(r"[^a-z0-9_-]")
log = logging.getLogger(__name__)


class UnixAccountError(RuntimeError):
    """The Unix account of a hub user cannot be made or used; the message says why."""


@dataclass(frozen=True)
class UnixAccountPolicy:
    prefix: str = "gl-"
    uid_min: int = 61000
    uid_max: int = 64999
    shell: str = "/bin/bash"  # JupyterLab's terminals start the account's shell
    hub_id: str = ""  # this hub's id (gpulease.host.state.hub_id), recorded in each account
    adopt_unmarked: bool = False  # GPULeaseHub.adopt_unmarked_accounts

    def __post_init__(self) -> None:
        if not 0 < self.uid_min <= self.uid_max:
            raise UnixAccountError(f"bad uid range {self.uid_min}-{self.uid_max}")
        if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,15}", self.prefix):
            raise UnixAccountError(
                f"Unix account prefix {self.prefix!r} must start with a lowercase letter or '_' "
                "and hold at most 16 of [a-z0-9_-]"
            )


@dataclass(frozen=True)
class UnixAccount:
    name: str
    uid: int
    gid: int
    hub_name: str


def unix_name(hub_name: str, prefix: str = "gl-") -> str:
    """`prefix + hub_name` when that is a safe Unix name of at most 32 characters.

    Otherwise the unsafe characters become '_' and the name is cut and given a
    hash of the hub name, so that two hub names never share an account
    (`a.b` and `a_b` differ in their hash) and the result is always accepted
    by useradd: lowercase letters, digits, '_' and '-', starting with the
    prefix's first character.
    """
    plain = prefix + hub_name
    safe = _UNSAFE.sub("_", plain.lower())
    if safe == plain and len(plain) <= MAX_UNIX_NAME:
        return plain
    digest = hashlib.sha256(hub_name.encode()).hexdigest()[:6]
    return f"{safe[: MAX_UNIX_NAME - 7]}-{digest}"


def choose_uid(name: str, taken: set[int], uid_min: int, uid_max: int) -> int:
    """A free uid (also free as a gid) in the range, starting at a hash of the name.

    Starting from the name's hash keeps uids stable across hosts that share
    homes (NFS) as long as they do not collide.
    """
    size = uid_max - uid_min + 1
    start = int(hashlib.sha256(name.encode()).hexdigest(), 16) % size
    for i in range(size):
        uid = uid_min + (start + i) % size
        if uid not in taken:
            return uid
    raise UnixAccountError(f"no free uid left in {uid_min}-{uid_max} for {name}")


def gecos(hub_name: str, hub_id: str) -> str:
    """The GECOS field of an account made for `hub_name` by the hub `hub_id`."""
    return f"{GECOS_MARK}{hub_name}{HUB_MARK}{hub_id}" if hub_id else GECOS_MARK + hub_name


def gecos_owner(field: str) -> tuple[str, str] | None:
    """(hub user, hub id) an account's GECOS field records; hub id "" when it records none
    (made by a gpulease before hub ids); None when gpulease did not make it."""
    if not field.startswith(GECOS_MARK):
        return None
    rest = field[len(GECOS_MARK):]
    user, mark, hub = rest.rpartition(HUB_MARK)
    return (user, hub) if mark and user and hub else (rest, "")


def account_problem(entry: pwd.struct_passwd, hub_name: str, policy: UnixAccountPolicy) -> str:
    """Why an existing account of the derived name may not be used ('' when it may): not
    gpulease's, another hub user's, another hub's, or no hub's unless adopted."""
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        return f"Unix account {entry.pw_name} has uid or gid 0"
    if not policy.uid_min <= entry.pw_uid <= policy.uid_max:
        return (f"Unix account {entry.pw_name} exists with uid {entry.pw_uid}, outside "
                f"gpulease's range {policy.uid_min}-{policy.uid_max}: it is not gpulease's")
    owner = gecos_owner(entry.pw_gecos)
    if owner is None or owner[0] != hub_name:
        return (f"Unix account {entry.pw_name} exists but was not made by gpulease for hub "
                f"user {hub_name} (its comment is {entry.pw_gecos!r})")
    made_by = owner[1]
    if made_by and made_by != policy.hub_id:
        return (f"Unix account {entry.pw_name} belongs to another gpulease hub, {made_by} "
                f"(this hub is {policy.hub_id or 'unnamed'}): two hubs on one host must not "
                "share an account, its uid, home or processes. Give this hub another "
                "GPULeaseHub.unix_account_prefix and uid range (unix_uid_min, unix_uid_max)")
    if not made_by and not policy.adopt_unmarked:
        return (f"Unix account {entry.pw_name} was made by gpulease for hub user {hub_name} "
                "but records no hub (an older gpulease, or another hub on this host): if it "
                f"is this hub's ({policy.hub_id}), set GPULeaseHub.adopt_unmarked_accounts = "
                "True to adopt it; otherwise give this hub another "
                "GPULeaseHub.unix_account_prefix")
    return ""


def blocking_dir(path: str | os.PathLike, stat_of: Callable[[str], os.stat_result] = os.stat,
                 *, execute: bool = False) -> tuple[str, int] | None:
    """The first folder on `path`'s way that an unrelated account cannot pass (path, mode).

    A per-user account belongs to no group but its own, so only the 'other'
    permission bits count: every folder on the way needs o+x, the path itself
    o+r (a file; o+rx with `execute`) or o+rx (a folder). `path` must be
    resolved (no symlinks).
    """
    p = Path(path)
    chain = [*reversed(p.parents), p]
    for i, part in enumerate(chain):
        try:
            mode = stat_of(str(part)).st_mode
        except FileNotFoundError:
            return (str(part), 0)
        last = i == len(chain) - 1
        need = stat.S_IXOTH
        if last:
            need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) or execute else 0)
        if mode & need != need:
            return (str(part), stat.S_IMODE(mode))
    return None


# --- the adapter -------------------------------------------------------------------


def _taken_ids() -> set[int]:
    return {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}


def _lookup(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def ensure_unix_account(hub_name: str, policy: UnixAccountPolicy, home: Path,
                        sleep: Callable[[float], None] = time.sleep) -> UnixAccount:
    """The hub user's Unix account, created (group of its own, no login password) if missing.

    Another hub process may create the same account at the same moment (the
    hub and its service, or two hubs on one host): a failed useradd is
    followed by a fresh look-up before it counts as a failure. Servers started
    at once create accounts at once, and useradd gives up at once when another
    holds /etc/passwd's lock ("cannot lock /etc/passwd; try again later"), so
    tries are spaced out (0.05 s doubling, about 1.5 s in all).
    """
    name = unix_name(hub_name, policy.prefix)
    errors = []
    for attempt in range(6):
        entry = _lookup(name)
        if entry is not None:
            problem = account_problem(entry, hub_name, policy)
            if problem:
                raise UnixAccountError(problem)
            if not _expired(name):  # made by an older gpulease
                _run(["usermod", "--expiredate", EXPIRED, name])
            if gecos_owner(entry.pw_gecos) == (hub_name, "") and policy.hub_id:
                _run(["usermod", "--comment", gecos(hub_name, policy.hub_id), name])
                log.warning("Adopted Unix account %s (uid %d), which recorded no hub, as hub "
                            "%s's (GPULeaseHub.adopt_unmarked_accounts)", name, entry.pw_uid,
                            policy.hub_id)
            return UnixAccount(name, entry.pw_uid, entry.pw_gid, hub_name)
        uid = choose_uid(name, _taken_ids(), policy.uid_min, policy.uid_max)
        try:
            if _group_gid(name) is None:
                _run(["groupadd", "--gid", str(uid), name])
            gid = _group_gid(name)
            _run(["useradd", "--uid", str(uid), "--gid", str(gid), "--no-create-home",
                  "--home-dir", str(home), "--shell", policy.shell, "--expiredate", EXPIRED,
                  "--comment", gecos(hub_name, policy.hub_id), name])
        except UnixAccountError as e:
            errors.append(str(e))
            if attempt < 5:
                sleep(0.05 * 2 ** attempt)
    raise UnixAccountError(f"could not create Unix account {name}: {'; '.join(errors)}")


def _expired(name: str, shadow: str = "/etc/shadow") -> bool:
    """Whether the account has an expiry date (gpulease's, or an admin's): then PAM
    refuses it every login. Unknown (shadow unreadable: not root) counts as expired."""
    try:
        with open(shadow) as f:
            for line in f:
                fields = line.rstrip("\n").split(":")
                if fields[0] == name and len(fields) > 7:
                    return fields[7] != ""
    except OSError:
        return True
    return False


def _group_gid(name: str) -> int | None:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def _run(cmd: list[str]) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UnixAccountError(f"{cmd[0]} failed: {e}") from None
    if done.returncode != 0:
        raise UnixAccountError(f"{' '.join(cmd)}: {done.stderr.strip() or done.returncode}")


def own_home(home: Path, account: UnixAccount) -> None:
    """Make `home` the account's alone (mode 0700), its content too when it was not yet.

    Homes made before per-user accounts were on belong to the hub's account;
    they are handed over once, at the first start as the user. Only
    homes/<hub name> itself, checked (a valid name, no link) and then held
    open, is changed; the walk never follows a link, and lchown changes a
    link rather than its target.
    """
    try:
        checked = checked_home(home.parent, account.hub_name)
        if checked != home.resolve():
            raise StateError(f"{home} is not {account.hub_name}'s home ({checked} is)")
        with open_home(checked) as fd:
            st = os.fstat(fd)
            if (st.st_uid, st.st_gid) != (account.uid, account.gid):
                for root, dirs, files in os.walk(checked):
                    for item in (*dirs, *files):
                        os.lchown(os.path.join(root, item), account.uid, account.gid)
                os.fchown(fd, account.uid, account.gid)
            os.fchmod(fd, 0o700)
    except StateError as e:
        raise UnixAccountError(str(e)) from None
