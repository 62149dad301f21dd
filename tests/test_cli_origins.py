"""The CLI reaches a hub whose service has an origin of its own, on a machine whose
resolver does not know `*.localhost` (Debian and Ubuntu without systemd-resolved:
`hosts: files dns`). The CLI runs in a child process whose getaddrinfo refuses every
`*.localhost` name, as such a machine's does: it must not need them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.hubproc import HubProcess

pytestmark = pytest.mark.e2e
ADMIN_PW = "admin-secret-pw"

# The child: the resolver of a machine without glibc's myhostname module, then the CLI.
DEBIAN_RESOLVER = """
import socket, sys
real = socket.getaddrinfo
def debian(host, *args, **kwargs):
    if isinstance(host, str) and host.rstrip(".").lower().endswith(".localhost"):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return real(host, *args, **kwargs)
socket.getaddrinfo = debian
from gpulease.hub.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = HubProcess(state=tmp_path_factory.mktemp("cli-origins") / "state",
                   admin_password=ADMIN_PW).start()
    yield h
    h.close()


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", DEBIAN_RESOLVER, *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **env})


def test_the_hubs_own_cli_file_names_the_service_and_needs_no_resolver(hub):
    assert hub.urls.service().startswith("http://gpulease--service.localhost:")
    r = cli("profiles", "list", env={"GPULEASE_STATE": str(hub.state)})
    assert r.returncode == 0, r.stderr
    assert "h200-1g" in r.stdout


def test_given_only_the_hubs_url_the_cli_asks_where_the_service_is(hub):
    token = hub.token_for("admin", ADMIN_PW)
    r = cli("--url", hub.url, "--token", token, "profiles", "list",
            env={"GPULEASE_STATE": "/nonexistent"})
    assert r.returncode == 0, r.stderr
    assert "h200-1g" in r.stdout


def test_the_resolver_stand_in_does_refuse_localhost_names(hub):
    # the check above would prove nothing if the child could resolve them
    probe = ("import socket\n" + DEBIAN_RESOLVER.split("from gpulease")[0]
             + "socket.getaddrinfo('gpulease--service.localhost', 80)\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "Name or service not known" in r.stderr
