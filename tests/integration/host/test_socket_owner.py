"""socket_owner: the uid behind the other end of a real loopback connection, and
ProxyPeers deciding it once per connection on a real tornado server."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
import socket
import subprocess
import sys

import pytest
import tornado.httpserver
import tornado.netutil
import tornado.web

from gpulease.hub.auth.socket_owner import (
    ProxyPeers,
    connections,
    owner_uid,
    peer_and_local,
    read_tables,
)
from tests.support.isolation_env import hub_python

NOBODY = 65534

# Two lines as Linux writes /proc/net/tcp (127.0.0.1:8081 <- 127.0.0.5:40000 of
# uid 1000, established), and a listening socket, which is never an answer.
SAMPLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0500007F:9C40 0100007F:1F91 01 00000000:00000000 00:00000000 00000000  1000        0 2 1
"""


@pytest.mark.skipif(sys.byteorder != "little", reason="the sample is a little-endian machine's")
def test_parses_proc_net_tcp():
    assert list(connections(SAMPLE)) == [(("127.0.0.5", 40000), ("127.0.0.1", 8081), 1000)]
    assert owner_uid(("127.0.0.5", 40000), ("127.0.0.1", 8081), [SAMPLE]) == 1000
    assert owner_uid(("127.0.0.5", 40000), ("127.0.0.1", 9999), [SAMPLE]) is None


def _listener(family=socket.AF_INET, host="127.0.0.1") -> socket.socket:
    server = socket.socket(family)
    server.bind((host, 0))
    server.listen()
    return server


@pytest.mark.skipif(read_tables() is None, reason="no /proc/net/tcp (not Linux)")
def test_own_connection_is_owned_by_this_user():
    with _listener() as server, socket.socket() as client:
        client.bind(("127.0.0.7", 0))
        client.connect(server.getsockname())
        accepted, peer = server.accept()
        with accepted:
            assert owner_uid(peer, accepted.getsockname(), read_tables()) == os.geteuid()


@pytest.mark.skipif(read_tables() is None, reason="no /proc/net/tcp (not Linux)")
def test_ipv4_client_of_a_dual_stack_listener():
    try:
        server = _listener(socket.AF_INET6, "::")
    except OSError:
        pytest.skip("no IPv6 here")
    with server, socket.create_connection(("127.0.0.1", server.getsockname()[1])):
        accepted, peer = server.accept()
        with accepted:
            local = accepted.getsockname()
            # the hub's side sees ::ffff:127.0.0.1; the client's socket is IPv4
            assert owner_uid(("127.0.0.1", peer[1]), ("127.0.0.1", local[1]),
                             read_tables()) == os.geteuid()


@pytest.mark.skipif(os.geteuid() != 0 or read_tables() is None,
                    reason="needs root, to connect as another user, and /proc/net/tcp")
def test_another_users_connection_is_theirs():
    # As a user's server would: another account connecting over loopback.
    python, why_not = hub_python()  # an interpreter other accounts can run
    if why_not:
        pytest.skip(why_not)
    with _listener() as server:
        code = ("import socket, sys, time; s = socket.create_connection(('127.0.0.1', "
                f"{server.getsockname()[1]})); sys.stdout.write('x'); sys.stdout.flush(); "
                "time.sleep(5)")
        child = subprocess.Popen([python, "-I", "-S", "-c", code], user=NOBODY,
                                 stdout=subprocess.PIPE)
        try:
            assert child.stdout.read(1) == b"x"
            accepted, peer = server.accept()
            with accepted:
                assert owner_uid(peer, accepted.getsockname(), read_tables()) == NOBODY
        finally:
            child.kill()
            child.wait()


class _Decisions(tornado.web.RequestHandler):
    peers: ProxyPeers

    async def get(self) -> None:
        peer, local = peer_and_local(self.request)
        own = await self.peers.is_own_proxy(self.request, peer, local)
        self.finish({"peer": peer[0], "own": own, "remote_ip": self.request.remote_ip})


@pytest.mark.skipif(read_tables() is None, reason="no /proc/net/tcp (not Linux)")
async def test_proxy_peers_on_a_real_tornado_server_once_per_connection(monkeypatch):
    # As JupyterHub runs it: xheaders on, so remote_ip follows the client's header;
    # the peer does not.
    peers = ProxyPeers(logging.getLogger("test"))
    decided = []
    real = peers._decide
    monkeypatch.setattr(peers, "_decide", lambda peer, local: decided.append(peer) or real(peer, local))
    _Decisions.peers = peers
    app = tornado.web.Application([("/", _Decisions)])
    server = tornado.httpserver.HTTPServer(app, xheaders=True)
    [sock] = tornado.netutil.bind_sockets(0, "127.0.0.1")
    server.add_sockets([sock])
    port = sock.getsockname()[1]

    def two_requests() -> list[dict]:
        conn = http.client.HTTPConnection("127.0.0.1", port, source_address=("127.0.0.6", 0))
        answers = []
        for forged in ("192.0.2.1", "192.0.2.2"):
            conn.request("GET", "/", headers={"X-Real-Ip": forged})
            answers.append(json.loads(conn.getresponse().read()))
        conn.close()
        return answers

    try:
        answers = await asyncio.get_running_loop().run_in_executor(None, two_requests)
    finally:
        server.stop()
    assert [a["remote_ip"] for a in answers] == ["192.0.2.1", "192.0.2.2"]  # tornado's
    assert all(a["peer"] == "127.0.0.6" and a["own"] is True for a in answers)
    assert len(decided) == 1  # one keep-alive connection, one look at the tables
