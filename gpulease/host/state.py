"""The state folder of the embedded hub: layout, permissions, secrets.

    <state>/private/   mode 0700, the hub's account only: databases, cookie
                       secret, proxy token, the CLI's token and URL
    <state>/homes/     mode 0755; homes/<user> is that user's home (0700)
    <state>/server-env/  as root, when per-user accounts cannot reach gpulease's
                       own environment: the copy servers run from (gpulease.hub.config.server_env)

The hub refuses to start when `private/` can be read by anyone else: it holds
what lets a reader forge cookies or rewrite the ledger.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpulease.core.policy.user_names import name_problem


class StateError(RuntimeError):
    """The state folder cannot be used as it is."""


@dataclass(frozen=True)
class StateDir:
    root: Path

    @property
    def private(self) -> Path:
        return self.root / "private"

    @property
    def homes(self) -> Path:
        return self.root / "homes"

    @property
    def hub_db_url(self) -> str:
        return f"sqlite:///{self.private / 'jupyterhub.sqlite'}"

    @property
    def gpulease_db_url(self) -> str:
        return f"sqlite:///{self.private / 'gpulease.sqlite'}"

    @property
    def cookie_secret_file(self) -> Path:
        return self.private / "jupyterhub_cookie_secret"

    @property
    def proxy_pid_file(self) -> Path:
        return self.private / "proxy.pid"

    @property
    def cli_file(self) -> Path:
        return self.private / "cli.json"

    def home_of(self, user: str) -> Path:
        """Where the home would be (no check: `checked_home` guards every change)."""
        return self.homes / user


# Where a root hub keeps state that per-user accounts must reach, when they cannot pass
# into the folder it was started from (docs/admin.md).
SHARED_STATE_BASE = Path("/var/lib/gpulease")


def default_state_root(cwd: Path, *, accounts_must_reach: bool,
                       base: Path = SHARED_STATE_BASE) -> Path:
    """./.gpulease, unless per-user accounts must reach it and cannot pass into `cwd`.

    Then base/<folder name>-<hash of its path>: one state folder per clone, so that
    two clones (or two checkouts of one) never share databases or homes.
    """
    cwd = cwd.resolve()
    if not accounts_must_reach or all(os.stat(p).st_mode & stat.S_IXOTH
                                      for p in (cwd, *cwd.parents)):
        return cwd / ".gpulease"
    key = hashlib.sha256(str(cwd).encode()).hexdigest()[:8]
    return base / f"{cwd.name or 'root'}-{key}"


def prepare_state_dir(root: str | os.PathLike, homes: bool = True) -> StateDir:
    """Create the layout if missing and check who can read `private/`; `homes`: also
    homes/ (the embedded shape's; the cluster shape's homes are claims)."""
    state = StateDir(Path(root).resolve())
    missing = [p for p in (state.root, *state.root.parents) if not p.exists()]
    state.root.mkdir(parents=True, exist_ok=True)
    for made in missing:  # 0755 whatever the umask: homes/ inside must stay reachable
        os.chmod(made, 0o755)
    check_not_world_writable(state.root)
    if not state.private.exists():
        state.private.mkdir(mode=0o700)
    check_private(state.private)
    for item in sorted(state.private.iterdir()):
        tighten_private_file(item)
    if not homes:
        return state
    if not state.homes.exists():
        state.homes.mkdir(mode=0o755)
    check_not_world_writable(state.homes)
    homes = state.homes.stat()
    if stat.S_IMODE(homes.st_mode) != 0o755 and homes.st_uid == os.getuid():
        os.chmod(state.homes, 0o755)  # homes/ lists the homes; each home is its user's alone
    return state


def check_not_world_writable(path: Path) -> None:
    """Anyone who can write here could swap `private/` or a home for their own."""
    mode = path.stat().st_mode
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise StateError(
            f"{path} is writable by every account (mode {stat.S_IMODE(mode):o}): anyone could "
            f"replace what the hub keeps there. Run `chmod o-w {path}`"
        )


def tighten_private_file(path: Path) -> None:
    """A database or secret in `private/`: the hub's account only.

    The 0700 folder already keeps everyone else out (checked above, and the
    hub refuses to start otherwise); files that SQLite or an older gpulease
    made with the umask's 0644 are tightened too, so that moving one out of
    the folder does not expose it.
    """
    st = path.lstat()
    if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)


def check_private(path: Path) -> None:
    st = path.stat()
    if st.st_uid != os.getuid():
        raise StateError(
            f"{path} belongs to uid {st.st_uid}, not to the hub's account (uid {os.getuid()})"
        )
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise StateError(
            f"{path} is accessible to other accounts (mode {stat.S_IMODE(st.st_mode):o}); "
            f"it holds the databases and secrets: run `chmod 700 {path}`"
        )


def read_or_create_secret(path: Path, nbytes: int = 32) -> str:
    """A hex secret kept in `path` (mode 0600), created on first use."""
    if path.exists():
        return path.read_text().strip()
    value = secrets.token_hex(nbytes)
    write_private(path, value + "\n")
    return value


def hub_id(state: StateDir) -> str:
    """This hub's id: random, made at its first start and kept in `private/hub_id`. Each
    Unix account the hub makes records it (gpulease.host.unix_accounts.gecos), so that two
    hubs on one host never take each other's accounts."""
    path = state.private / "hub_id"
    if path.is_symlink():
        raise StateError(f"{path} is a symbolic link: this hub's id is a file of its own "
                         "(remove the link and restore the file)")
    try:
        value = read_or_create_secret(path, nbytes=8)
    except UnicodeDecodeError:
        value = path.read_bytes().decode(errors="replace").strip()
    if not re.fullmatch(r"[0-9a-f]{16,64}", value):
        raise StateError(f"{path} holds {value[:80]!r}, not a hub id (16 to 64 lowercase hex "
                         "digits): restore this hub's own id, which its Unix accounts "
                         "record in their comment (`getent passwd`: 'gpulease user NAME hub "
                         "ID')")
    return value


def write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def write_cli_file(state: StateDir, url: str, token: str, service_url: str = "") -> None:
    """Where the CLI finds the embedded hub, its gpulease service and its admin token."""
    write_private(state.cli_file, json.dumps(
        {"url": url, "token": token, "service_url": service_url}) + "\n")


def read_cli_file(state: StateDir) -> dict[str, str] | None:
    try:
        return json.loads(state.cli_file.read_text())
    except (OSError, ValueError):
        return None


def checked_home(homes: Path, user: str) -> Path:
    """homes/<user>, resolved, when `user` is a valid name and that is no link.

    The one gate before a home is made, chmodded or chowned: a name outside
    the rule (".", "..", "a/b") never becomes a path, and a home left as a
    link (by hand, or by an older layout) is not followed out of homes/.
    The homes folder itself may be a link (an admin's other disk).
    """
    problem = name_problem(user)
    if problem:
        raise StateError(f"no home is made or changed for a user name outside the rule: "
                         f"{problem}")
    folder = homes.resolve()
    home = folder / user
    if home.is_symlink():
        raise StateError(f"{home} is a symbolic link: a home must be a folder of its own in "
                         f"{folder}; move the link away (nothing was changed)")
    if home.resolve().parent != folder or home.name != user:
        raise StateError(f"{home} is not directly in {folder}")
    return home


def ensure_home(state: StateDir, user: str) -> Path:
    """The user's home (0700): shared by all their servers, never deleted on stop."""
    home = checked_home(state.homes, user)
    try:
        home.mkdir(mode=0o700)
    except FileExistsError:
        pass
    with open_home(home) as fd:
        os.fchmod(fd, 0o700)
    return home


@contextmanager
def open_home(home: Path) -> Iterator[int]:
    """A descriptor of the home folder itself, never of what a link there points to:
    a link put in its place after `checked_home` looked fails here (ELOOP)."""
    try:
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        what = "a symbolic link" if home.is_symlink() else "not a folder"
        raise StateError(f"{home} is {what}: a home must be a folder of its own "
                         f"(nothing was changed; {e.strerror})") from None
    try:
        yield fd
    finally:
        os.close(fd)


def keep_crypt_key(state: StateDir) -> None:
    """Auth state (an identity provider's tokens, which refreshes need) is encrypted with
    JUPYTERHUB_CRYPT_KEY when it is set (the chart's Secret), else with private/crypt_key,
    made at the first start: a restart keeps every session and its tokens."""
    from jupyterhub.crypto import CryptKeeper

    keeper = CryptKeeper.instance()
    if not keeper.keys:
        keeper.keys = [read_or_create_secret(state.private / "crypt_key")]
