"""The one rule for user names, and what gpulease says about names outside it.

A user name becomes a folder (homes/<name>), part of a Unix account's name
(gl-<name>), of cgroup and unit names, and in the cluster shape of pod and
volume names (DNS labels). Valid names are safe for all of them:

    ^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$   and not a system account's name

Every entry that creates or renames a user refuses anything else with
`name_problem`'s words, before anything is written: JupyterHub's API and
admin page (LocalAccountsAuthenticator.validate_username and
gpulease.hub.web.hub_user_api), gpulease's api/users and `gpulease users add`
(gpulease.store.accounts), the first admin. Nothing is lowercased or mapped
silently: "Alice" is refused, naming "alice". Identity providers (OpenID Connect
and GitHub, hub/auth/) map their names into this set (gpulease/store/identities.py).
Names made before the rule are reported at start (`outside_the_rule`,
`rename_hint`); the home code refuses them (gpulease.host.state.checked_home).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from gpulease.core.shown import shown

NAME_PATTERN = r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$"
MAX_NAME_LENGTH = 32  # useradd's limit; also well inside a DNS label's 63
# fullmatch, not match: `$` also matches before a final newline ("alice\n").
_NAME_RE = re.compile(NAME_PATTERN.removeprefix("^").removesuffix("$"))
_NOT_ALLOWED = re.compile(r"[^a-z0-9-]")

NAME_RULE = (f"user names match {NAME_PATTERN}: 1 to {MAX_NAME_LENGTH} lowercase letters a-z, "
             "digits and '-', starting with a letter and not ending with '-', and are no "
             "system account's name (root, nobody, ...)")

# System accounts of Debian/Ubuntu base images (and the notebook images' own
# user): a hub user named like one would be mistaken for it in logs, process
# lists, mail and webhook mentions, and in shapes that use the name as is.
RESERVED_NAMES = frozenset(
    {
        "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news",
        "uucp", "proxy", "www-data", "backup", "list", "irc", "gnats", "nobody",
        "nogroup", "systemd-network", "systemd-resolve", "systemd-timesync",
        "messagebus", "sshd", "postgres", "jovyan",
    }
)  # fmt: skip


def _what_is_wrong(name: str) -> str:
    """The first thing that keeps `name` from matching the pattern."""
    if not name:
        return "it is empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"it is {len(name)} characters long"
    if name.lower() != name and is_valid_name(name.lower()):
        return f"it has uppercase letters (the name in lowercase, {shown(name.lower())}, is valid)"
    if any("A" <= c <= "Z" for c in name):
        return "it has uppercase letters"
    odd = sorted(set(_NOT_ALLOWED.findall(name)))
    if odd:
        listed = ", ".join(shown(c) for c in odd)
        return f"it has characters other than a-z, 0-9 and '-': {listed}"
    if not "a" <= name[0] <= "z":
        return "it does not start with a letter"
    return "it ends with '-'"


def name_problem(name: object) -> str:
    """'' for a valid user name; otherwise what is wrong with it and what is allowed."""
    if not isinstance(name, str):
        return f"a user name must be a string, got {shown(name)}; {NAME_RULE}"
    if not _NAME_RE.fullmatch(name):
        return f"user name {shown(name)} is not allowed: {_what_is_wrong(name)}; {NAME_RULE}"
    if name in RESERVED_NAMES:
        return f"user name {shown(name)} is reserved for a system account; {NAME_RULE}"
    return ""


def is_valid_name(name: object) -> bool:
    return not name_problem(name)


def name_stem(name: str) -> str:
    """`name` in the rule's alphabet: ASCII-folded, lowercase, other characters as '-',
    starting with a letter, at most MAX_NAME_LENGTH long ("" when nothing is left). It
    may still be a reserved name."""
    ascii_only = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    text = _NOT_ALLOWED.sub("-", ascii_only.lower())
    return re.sub(r"-{2,}", "-", text).lstrip("-0123456789")[:MAX_NAME_LENGTH].rstrip("-")


def suggested_name(name: str) -> str | None:
    """A valid name close to `name` (for a rename hint), or None when there is none."""
    text = name_stem(name)
    return text if is_valid_name(text) else None


@dataclass(frozen=True)
class BadName:
    """A user name made before the rule (or written into a database by hand)."""

    name: str
    problem: str
    where: tuple[str, ...]  # "hub user", "local account"


def outside_the_rule(hub_users: Iterable[str], local_accounts: Iterable[str]) -> list[BadName]:
    """The names of JupyterHub's users table and gpulease's local accounts outside the rule."""
    places: dict[str, list[str]] = {}
    for where, names in (("hub user", hub_users), ("local account", local_accounts)):
        for name in names:
            if not is_valid_name(name):
                places.setdefault(name, []).append(where)
    return [BadName(name, name_problem(name), tuple(where))
            for name, where in sorted(places.items())]


def rename_hint(bad: BadName, homes: str) -> str:
    """One log line: what the name no longer gets, and how to keep the user under a valid name."""
    new = suggested_name(bad.name)
    target = shown(new) if new else "a valid name"
    new_text = new or "NEW"
    steps = []
    if "hub user" in bad.where:
        steps.append(f"rename the hub user with JupyterHub's PATCH /hub/api/users/{bad.name} "
                     f'{{"name": "{new_text}"}} (or Edit User on the hub\'s admin page)')
    if "local account" in bad.where:
        steps.append(f"give it a local account with `gpulease users add {new_text}` "
                     "(gpulease cannot rename one; the old one can no longer log in)")
    steps.append(f"move its files, if any, with `mv {homes}/{bad.name} {homes}/{new_text}`")
    return (f"{bad.problem[:1].upper()}{bad.problem[1:]}. Found as: {', '.join(bad.where)}, "
            "made before this rule. It can neither log in nor start a server, and nothing under "
            f"{homes} is touched for it. To keep this user, rename it to {target}: "
            f"{'; '.join(steps)}. Its credits and usage stay recorded under "
            f"user:{bad.name} (docs/admin.md, User names).")
