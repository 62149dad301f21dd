"""Scripts on this machine: which interpreter runs one.

The isolation check (which environments a server's account must reach) and the
warm launcher (which interpreter a server's script runs with) both read it.
"""

from __future__ import annotations

from pathlib import Path


def shebang_interpreter(script: Path) -> str | None:
    """The interpreter a script's first line (#!) names, None if it names none or the
    script cannot be read."""
    try:
        with open(script, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode(errors="replace").split()
    return parts[0] if parts else None
