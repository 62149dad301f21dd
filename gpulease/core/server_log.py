"""The rules of a server's own log: where it is, how it rotates, what of it is shown.

A server's output (its stdout and stderr: the researcher's config, their
packages, JupyterLab) is the researcher's text. It goes to a log of its own,
never the hub's (gpulease.host.server_logs, docs/admin.md "Servers' logs"), and
parts of it are shown to people: the tail of a start that failed to its owner
(the spawn's progress, the home page), the whole log to admins (`gpulease logs`,
`GET api/logs/...`). What a researcher writes lands in an admin's terminal, so
what is shown is `shown_text`: terminal control sequences and control
characters taken out. Pages escape it as any text (Jinja's autoescape,
html.escape), never mark it safe.

The tail shown at a failed start is the kubelet's rule for a container's
termination message under `terminationMessagePolicy: FallbackToLogsOnError`
(kubernetes pkg/kubelet/kuberuntime, `readLastStringFromContainerLogs`): its
last TAIL_LINES lines, of which the last TAIL_BYTES bytes. So both shapes show
the same amount: the embedded shape cuts it from the server's log, the cluster
shape reads the message the kubelet cut.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath

from gpulease.core.policy.user_names import name_problem

# kubernetes pkg/kubelet/container: MaxContainerTerminationMessageLogLines and ...Length
TAIL_LINES = 80
TAIL_BYTES = 2048

LOGS_FOLDER = ("logs", "servers")  # <state>/logs/servers/<user>/<server>.log
DEFAULT_SERVER_FILE = "_default"  # the default server ("" by name): "_" is in no server name
# JupyterHub 6's server names (jupyterhub.slugs.is_valid_safe_slug): checked again
# here, as a name becomes a file name
SERVER_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
SERVER_NAME_MAX = 63
SERVER_NAME_RULE = ("server names are 1-63 lowercase letters a-z, digits and single '-' "
                    "between them (the default server has none)")

MIN_MAX_BYTES = 64 * 1024  # one read of the pipe (the writer's) must fit in a file
MAX_MAX_BYTES = 1024 ** 3
MAX_KEEP = 100
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
DEFAULT_KEEP = 2


@dataclass(frozen=True)
class Rotation:
    """A log file grows to `max_bytes`, then is renamed .1 (.1 to .2, ...) and a new
    one begins; `keep` renamed files are kept, older ones removed. A server's log is
    at most (keep + 1) * max_bytes. Each start of a server begins a new file too,
    so the current file holds this start's output, and .1 the one before."""

    max_bytes: int = DEFAULT_MAX_BYTES
    keep: int = DEFAULT_KEEP

    def __post_init__(self) -> None:
        problem = rotation_problem(self.max_bytes, self.keep)
        if problem:
            raise ValueError(problem)


def rotation_problem(max_bytes: object, keep: object) -> str:
    """'' when a rotation of these numbers is allowed; else what is wrong, and what is."""
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) \
            or not MIN_MAX_BYTES <= max_bytes <= MAX_MAX_BYTES:
        return (f"server_log_max_bytes must be a whole number of bytes from {MIN_MAX_BYTES} "
                f"(64 KiB) to {MAX_MAX_BYTES} (1 GiB), not {max_bytes!r}")
    if not isinstance(keep, int) or isinstance(keep, bool) or not 0 <= keep <= MAX_KEEP:
        return f"server_log_keep must be a whole number from 0 to {MAX_KEEP}, not {keep!r}"
    return ""


def rotated_names(name: str, keep: int) -> list[str]:
    """The names a log file's older parts take, newest first: x.log.1 ... x.log.<keep>."""
    return [f"{name}.{n}" for n in range(1, keep + 1)]


def renames(name: str, keep: int) -> tuple[str | None, list[tuple[str, str]]]:
    """One rotation of `name`: the file removed first (None: none), then the renames, in
    the order to make them (oldest first, so that none overwrites one still needed)."""
    if keep == 0:
        return name, []
    older = rotated_names(name, keep)
    chain = [name, *older]
    moves = [(chain[i], chain[i + 1]) for i in range(len(chain) - 2, -1, -1)]
    return older[-1], moves


def server_name_problem(server: object) -> str:
    """'' for a server name a log may be kept for ("" is the default server)."""
    if server == "":
        return ""
    if not isinstance(server, str) or len(server) > SERVER_NAME_MAX \
            or not SERVER_NAME.fullmatch(server):
        return f"server name {server!r} is not allowed: {SERVER_NAME_RULE}"
    return ""


def log_file_name(server: str) -> str:
    """The file name of a server's log in its user's folder (ValueError: no such name)."""
    problem = server_name_problem(server)
    if problem:
        raise ValueError(problem)
    return f"{server or DEFAULT_SERVER_FILE}.log"


def log_path(root: PurePath, user: str, server: str) -> PurePath:
    """<root>/logs/servers/<user>/<server>.log, `root` the state folder. A name outside
    the rules (which could leave the folder: "..", "a/b") is a ValueError, never a path."""
    problem = name_problem(user)
    if problem:
        raise ValueError(problem)
    return root.joinpath(*LOGS_FOLDER, user, log_file_name(server))


def tail(data: bytes, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> bytes:
    """The last `lines` lines of `data`, of which at most the last `max_bytes` bytes (the
    kubelet's rule: what a dying process wrote last is what is worth reading). A final
    line without its newline counts as a line."""
    if lines <= 0 or max_bytes <= 0 or not data:
        return b""
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    start = end
    for _ in range(lines):
        start = data.rfind(b"\n", 0, start)
        if start < 0:
            break
    kept = data[start + 1:] if start >= 0 else data
    return kept[-max_bytes:]


# ESC-introduced sequences, as ECMA-48 defines them: CSI (ESC [ ... final byte), the
# strings OSC, DCS, SOS, PM and APC (ended by BEL or ST = ESC \; one never ended is taken
# out to the end of its line, so that it hides no later line: its opening is gone, so no
# terminal reads on as a string),
# and the two- and three-byte escapes (ESC, intermediates 0x20-0x2f, a final byte).
# Their 8-bit C1 forms (0x9b CSI, 0x9d OSC, ...) are taken out as C1 characters are.
_CSI = r"\x1b\[[0-?]*[ -/]*[@-~]?"
_STRING = r"\x1b[\]PX^_].*?(?:\x07|\x1b\\|\x9c|(?=\n)|\Z)"
_ESCAPE = r"\x1b[ -/]*[0-~]?"
_SEQUENCES = re.compile(f"{_CSI}|{_STRING}|{_ESCAPE}", re.DOTALL)
_C1_STRING = re.compile(r"[\x90\x98\x9d\x9e\x9f].*?(?:\x07|\x9c|(?=\n)|\Z)",
                        re.DOTALL)
_C1_CSI = re.compile(r"\x9b[0-?]*[ -/]*[@-~]?")
# Every other C0 control but \t and \n, DEL, the C1 controls, and the Unicode
# controls that reorder text on the screen (bidirectional embeddings, overrides,
# isolates): what is shown reads in the order it was written.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u200e\u200f]")


def shown_text(data: bytes | str) -> str:
    """A server's output as it may be shown in a terminal or a page: decoded (bytes that
    are no UTF-8 replaced), escape sequences and control characters taken out, and a
    carriage return kept as a terminal shows it: "\\r\\n" is a newline, and of a line
    rewritten with "\\r" (a progress bar) the last text written."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
    text = _SEQUENCES.sub("", text)
    text = _C1_STRING.sub("", text)
    text = _C1_CSI.sub("", text)
    text = text.replace("\r\n", "\n")
    if "\r" in text:
        text = "\n".join(_last_rewrite(line) for line in text.split("\n"))
    return _CONTROLS.sub("", text)


def _last_rewrite(line: str) -> str:
    parts = [p for p in line.split("\r") if p]
    return parts[-1] if parts else ""


def shown_tail(data: bytes) -> str:
    """What a failed start shows of its server's output: its tail, as `shown_text`, with
    no blank lines at its ends."""
    return shown_text(tail(data)).strip("\n")


def kubectl_logs_command(namespace: str, user: str, server: str) -> str:
    """How an admin reads a cluster server's full log: its pod, found by the labels
    kubespawner gives it (a default server's pod has no servername label)."""
    servername = (f"hub.jupyter.org/servername={server}" if server
                  else "!hub.jupyter.org/servername")
    return (f"kubectl logs --namespace {namespace} --selector "
            f"'hub.jupyter.org/username={user},{servername}'")
