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

pytestmark = pytest.mark.e2e

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


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", DEBIAN_RESOLVER, *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **env})


def test_the_hubs_own_cli_file_names_the_service_and_needs_no_resolver(hub):
    assert hub.urls.service().startswith("http://gpulease--service.localhost:")
    r = cli("profiles", "list", env={"GPULEASE_STATE": str(hub.state)})
    assert r.returncode == 0, r.stderr
    assert "h200-1g" in r.stdout


def test_given_only_the_hubs_url_the_cli_asks_where_the_service_is(hub):
    token = hub.admin_token
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


@pytest.fixture
def site_says():
    """A stand-in hub whose GET /hub/gpulease/site names the service `said`."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    said = {"service": ""}

    class Site(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = json.dumps(said).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], said
    server.shutdown()


@pytest.mark.parametrize("service, expected", [
    # a subdomain of the hub's host: where the token may go
    ("http://gpulease--service.localhost:{port}/services/gpulease/",
     "http://gpulease--service.localhost:{port}/services/gpulease/"),
    # anywhere else (a shared-origin hub's guess at 127.0.0.1, a hostile answer): only the
    # path is taken, on the hub the admin named
    ("http://127.0.0.1:{port}/services/gpulease/", "http://localhost:{port}/services/gpulease/"),
    ("http://evil.example/steal/", "http://localhost:{port}/steal/"),
    ("https://localhost.evil.example/x/", "http://localhost:{port}/x/"),
    ("/jupyter/services/gpulease/", "http://localhost:{port}/jupyter/services/gpulease/"),
])
def test_the_token_goes_only_to_the_hubs_host_or_its_subdomains(site_says, service, expected):
    from gpulease.hub.cli.client import HubClient

    port, said = site_says
    said["service"] = service.format(port=port)
    client = HubClient(f"http://localhost:{port}", "t0ken")
    assert client.service_url == expected.format(port=port)
