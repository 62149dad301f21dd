"""What a server forked by the warm launcher shares with the launcher and its siblings.

docs/security.md ("Address-space layout, canary and hash seed between warm servers")
lists it; here a Python process forks as the launcher does (os.fork, no exec) and the
child reads what the list says: the same AT_RANDOM bytes (glibc's stack canary and
pointer guard come from them), the same libc address and the same string-hash seed;
Python's `random` is reseeded in the child, and a program the child execs (a kernel,
a terminal's shell) gets its own of each.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
AT_RANDOM = 25


def _facts() -> dict:
    """This process's AT_RANDOM bytes, libc's address, a string hash and a random draw."""
    auxv = Path("/proc/self/auxv").read_bytes()
    pairs = struct.iter_unpack("QQ", auxv)
    where = next(value for key, value in pairs if key == AT_RANDOM)
    libc = ctypes.CDLL(None)
    return {"at_random": ctypes.string_at(where, 16).hex(),
            "libc": ctypes.cast(libc.printf, ctypes.c_void_p).value,
            "hash": hash("gpulease"), "random": random.random()}


FACTS = f"""
import json, sys
sys.path.insert(0, {str(ROOT)!r})
from tests.integration.host.test_warm_share import _facts
print(json.dumps(_facts()))
"""


def _in_fork() -> dict:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # as the warm launcher forks a server
        os.close(read)
        os.write(write, json.dumps(_facts()).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        data = json.loads(f.read())
    os.waitpid(pid, 0)
    return data


@pytest.fixture
def linux():
    if not Path("/proc/self/auxv").exists() or struct.calcsize("P") != 8:
        pytest.skip("reads a 64-bit Linux process's auxiliary vector")


def test_a_forked_server_shares_canary_layout_and_hash_seed_not_random(linux):
    parent, child = _facts(), _in_fork()
    assert child["at_random"] == parent["at_random"]  # stack canary, pointer guard
    assert child["libc"] == parent["libc"]  # the address-space layout
    assert child["hash"] == parent["hash"]  # the string-hash seed
    assert child["random"] != parent["random"]  # CPython reseeds `random` after a fork


def test_a_program_the_server_execs_gets_its_own(linux):
    parent = _facts()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    done = subprocess.run([sys.executable, "-c", FACTS], capture_output=True, text=True,
                          timeout=60, env=env, check=True)
    fresh = json.loads(done.stdout)
    assert fresh["at_random"] != parent["at_random"]
    assert fresh["hash"] != parent["hash"]


def test_security_md_names_what_warm_servers_share_and_how_to_turn_it_off():
    text = (ROOT / "docs" / "security.md").read_text()
    start = text.index("- **Address-space layout, canary and hash seed between warm servers.**")
    section = text[start:start + 2500]
    for needle in ("AT_RANDOM", "stack canary", "pointer guard", "libc", "hash seed",
                   "root launcher", "`random`", "GPULeaseHub.warm_start = False",
                   "tests/integration/host/test_warm_share.py"):
        assert needle in section, f"{needle!r} missing from docs/security.md's warm section"
