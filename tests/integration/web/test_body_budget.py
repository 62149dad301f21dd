"""BodyBudget and BudgetedHTTPServer: large bodies held at once are bounded per server.

A real tornado HTTPServer in this process, with raw sockets as clients: bodies
sent but for their last byte, as a stranger holding connections would.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from tornado import web

from gpulease.hub.web.body_budget import BodyBudget, BudgetedHTTPServer

KIB = 1 << 10


def test_budget_takes_what_fits_and_gets_it_back():
    budget = BodyBudget(total=100, small=10)
    assert budget.take(60) and budget.take(40)
    assert not budget.take(1)
    budget.give_back(40)
    assert budget.take(30) and budget.held == 90


class Held(web.RequestHandler):
    """Answers a POST once the test lets it: its body is held meanwhile."""

    def initialize(self, release: asyncio.Event) -> None:
        self.release = release

    async def post(self) -> None:
        await self.release.wait()
        self.write(f"got {len(self.request.body)}")


@pytest.fixture
async def server():
    release = asyncio.Event()
    app = web.Application([("/", Held, {"release": release})])
    budget = BodyBudget(total=200 * KIB, small=16 * KIB)
    srv = BudgetedHTTPServer(app, max_body_size=100 * KIB, body_budget=budget)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    srv.add_sockets([sock])
    yield sock.getsockname()[1], budget, release, srv
    srv.stop()
    await srv.close_all_connections()


async def _open(port: int, head: bytes, body: bytes):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + body)
    await writer.drain()
    return reader, writer


async def _answer(reader: asyncio.StreamReader, timeout: float = 5) -> bytes:
    try:
        return await asyncio.wait_for(reader.read(200), timeout)
    except (TimeoutError, ConnectionError):
        return b""


def _post(length: int) -> bytes:
    return f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode()


async def test_held_back_bodies_past_the_budget_are_refused(server):
    port, budget, release, _ = server
    # Two bodies of 90 KiB, their last byte held back: they fit (180 of 200 KiB).
    held = [await _open(port, _post(90 * KIB), b"x" * (90 * KIB - 1)) for _ in range(2)]
    await asyncio.sleep(0.2)
    assert budget.held == 180 * KIB
    # A third does not fit: refused on its headers, none of it read.
    reader, _ = await _open(port, _post(90 * KIB), b"")
    assert (await _answer(reader)).startswith(b"HTTP/1.1 400 ")
    # A small body (a login) is always taken, however full the budget.
    reader, writer = await _open(port, _post(100), b"y" * 100)
    release.set()
    assert b"got 100" in await _answer(reader)
    for _, w in held:
        w.close()
    writer.close()
    await asyncio.sleep(0.2)
    assert budget.held == 0  # closed connections give theirs back


async def test_a_body_is_held_until_it_is_answered(server):
    port, budget, release, _ = server
    reader, writer = await _open(port, _post(90 * KIB), b"x" * (90 * KIB))
    await asyncio.sleep(0.2)
    assert budget.held == 90 * KIB  # all arrived, not answered yet: still held
    release.set()
    assert b"got 92160" in await _answer(reader)
    await asyncio.sleep(0.1)
    assert budget.held == 0
    writer.close()


async def test_a_chunked_body_counts_what_it_has_sent(server):
    port, budget, _, _ = server
    await _open(port, _post(90 * KIB), b"x" * (90 * KIB - 1))
    head = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b"%x\r\n%s\r\n" % (50 * KIB, b"z" * (50 * KIB))
    _, chunked = await _open(port, head, chunk * 2)  # 100 KiB so far, unfinished
    await asyncio.sleep(0.2)
    assert budget.held == 190 * KIB
    reader, _ = await _open(port, _post(20 * KIB), b"")
    assert (await _answer(reader)).startswith(b"HTTP/1.1 400 ")
    chunked.close()
    await asyncio.sleep(0.2)
    assert budget.held == 90 * KIB
    reader, writer = await _open(port, _post(20 * KIB), b"")
    assert await _answer(reader, timeout=0.5) == b""  # taken: waits for its body
    assert budget.held == 110 * KIB
    writer.close()


async def test_a_body_must_arrive_in_time(server):
    port, _, _, srv = server
    srv.conn_params.body_timeout = 0.5  # BODY_TIMEOUT_S is a minute
    reader, _ = await _open(port, _post(100), b"x" * 10)
    assert await _answer(reader, timeout=5) == b""  # closed, unanswered
