"""gpulease/site_urls: every URL from one place, and clients that reach *.localhost."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpulease.site_urls import SiteURLs, is_loopback_name, loopback_session

SUBDOMAINS = SiteURLs("http://localhost:8000/", "http://localhost:8000")
EXPOSED = SiteURLs("https://gpu.example.org/lab/", "https://gpu.example.org")
SHARED = SiteURLs("/")  # one origin (GPULeaseHub.allow_shared_origin): relative links


def test_with_subdomains_each_has_its_origin():
    assert SUBDOMAINS.hub("home") == "http://localhost:8000/hub/home"
    assert SUBDOMAINS.service("api/profiles") == (
        "http://gpulease--service.localhost:8000/services/gpulease/api/profiles")
    assert SUBDOMAINS.server("ada") == "http://ada.localhost:8000/user/ada/"
    assert SUBDOMAINS.server("ada", "train", "lab") == "http://ada.localhost:8000/user/ada/train/lab"


def test_a_base_url_and_https_are_kept():
    assert EXPOSED.hub() == "https://gpu.example.org/lab/hub/"
    assert EXPOSED.service() == "https://gpulease--service.gpu.example.org/lab/services/gpulease/"
    assert EXPOSED.server("ada") == "https://ada.gpu.example.org/lab/user/ada/"


def test_names_are_encoded_as_jupyterhub_encodes_them():
    from jupyterhub.utils import subdomain_hook_idna

    for name in ("a--b", "Zoë", "x" * 70):
        host = subdomain_hook_idna(name, "localhost", "user")
        assert SUBDOMAINS.server(name).startswith(f"http://{host}:8000/user/")


def test_one_shared_origin_gives_paths():
    assert SHARED.hub("home") == "/hub/home"
    assert SHARED.service("usage") == "/services/gpulease/usage"
    assert SHARED.server("ada") == "/user/ada/"


@pytest.mark.parametrize("host, loopback", [
    ("localhost", True), ("ada.localhost", True), ("GPULEASE--SERVICE.LOCALHOST.", True),
    ("localhost.example.org", False), ("notlocalhost", False), (None, False)])
def test_loopback_names(host, loopback):
    assert is_loopback_name(host) is loopback


@pytest.fixture
def echo_host():
    """A server on 127.0.0.1 answering with the Host header it got."""

    class Echo(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = self.headers["Host"].encode()
            self.send_response(200)
            self.send_header("Set-Cookie", "seen=1; Path=/")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def test_a_localhost_name_is_reached_without_the_resolver(echo_host, monkeypatch):
    # Debian without glibc's myhostname module: *.localhost is unknown to the resolver
    real = socket.getaddrinfo

    def debian(host, *args, **kwargs):
        if isinstance(host, str) and host.endswith(".localhost"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", debian)
    url = f"http://gpulease--service.localhost:{echo_host}/services/gpulease/api/x"
    session = loopback_session()
    r = session.get(url, timeout=10)
    assert r.status_code == 200
    assert r.text == f"gpulease--service.localhost:{echo_host}"  # the proxy routes by it
    assert r.url == url
    assert [c.domain for c in session.cookies] == ["gpulease--service.localhost"]
