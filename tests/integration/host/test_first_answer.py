"""The first-answer probe: the moment a billing session opens, taken as the server
answers even while the hub's event loop is busy (a real HTTP server on loopback)."""

from __future__ import annotations

import asyncio
import datetime as dt
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpulease.core.clock import utcnow
from gpulease.spawners.start.first_answer import first_answer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    """An HTTP server that starts listening after `delay_s` and notes when it did, and
    when it first answered."""

    def __init__(self, port: int, delay_s: float) -> None:
        self.port = port
        self.first: dt.datetime | None = None
        self.listening: dt.datetime | None = None
        self.httpd: ThreadingHTTPServer | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.first = outer.first or utcnow()
                self.send_response(404)  # any answer counts
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        def serve() -> None:
            time.sleep(delay_s)
            self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
            self.listening = utcnow()  # from here on any client gets an answer
            self.httpd.serve_forever(poll_interval=0.05)

        threading.Thread(target=serve, daemon=True).start()

    def close(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()


def test_the_answer_is_timed_as_it_comes_while_the_loop_is_busy():
    port = free_port()
    server = _Server(port, delay_s=0.5)

    async def main() -> dt.datetime:
        probe = asyncio.ensure_future(first_answer(f"http://127.0.0.1:{port}/api",
                                                   lambda: True, 10))
        await asyncio.sleep(0.3)
        time.sleep(0.8)  # the loop is held (another spawn, a slow handler) as the server starts
        return await probe

    try:
        answered = asyncio.run(main())
    finally:
        server.close()
    assert server.listening is not None and isinstance(answered, dt.datetime)
    assert server.first is not None and answered >= server.first
    # Within the probe's 10 ms between tries of the server's first moment, not when
    # the loop was free again (~0.6 s later).
    lag = (answered - server.listening).total_seconds()
    assert 0 <= lag < 0.05, lag


def test_no_answer_is_none_after_the_timeout_and_false_once_not_ours():
    port = free_port()
    started = time.monotonic()
    assert asyncio.run(first_answer(f"http://127.0.0.1:{port}/api", lambda: True, 0.3)) is None
    assert 0.3 <= time.monotonic() - started < 2
    ours = threading.Event()
    ours.set()
    threading.Timer(0.2, ours.clear).start()  # the process ended, or a stop began
    assert asyncio.run(first_answer(f"http://127.0.0.1:{port}/api", ours.is_set, None)) is False


def test_a_server_that_accepts_but_does_not_answer_yet_is_waited_for():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # accepts (the kernel does), never answers
    port = listener.getsockname()[1]
    try:
        assert asyncio.run(first_answer(f"http://127.0.0.1:{port}/api", lambda: True, 0.5)) \
            is None
    finally:
        listener.close()


def test_a_cancelled_wait_ends_its_probe_thread():
    port = free_port()

    async def main() -> None:
        probe = asyncio.ensure_future(first_answer(f"http://127.0.0.1:{port}/api",
                                                   lambda: True, None))
        await asyncio.sleep(0.1)
        probe.cancel()
        await asyncio.gather(probe, return_exceptions=True)

    asyncio.run(main())
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and any(
            t.name == "gpulease-first-answer" for t in threading.enumerate()):
        time.sleep(0.05)
    assert not [t for t in threading.enumerate() if t.name == "gpulease-first-answer"]


def test_a_slow_answer_is_timed_at_its_first_byte_and_holds_no_probe():
    """A server's own code decides how its answer comes: one that sends its status line
    at once and then drips its headers (each byte within the probe's 2 s per read)
    answered at its first byte; its billing opens there, not when it chose to finish
    (or never: a drip that never ends held the probe's thread, and billing, for good)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    first_byte: list[dt.datetime] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)  # the probe's request
            first_byte.append(utcnow())
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            for _ in range(8):  # 4 s of headers, a byte every 0.5 s
                time.sleep(0.5)
                try:
                    conn.sendall(b"X")
                except OSError:
                    return  # the probe has its answer and went

    threading.Thread(target=serve, daemon=True).start()
    started = time.monotonic()
    try:
        answered = asyncio.run(first_answer(f"http://127.0.0.1:{port}/api", lambda: True, 10))
    finally:
        listener.close()
    assert isinstance(answered, dt.datetime) and first_byte
    assert 0 <= (answered - first_byte[0]).total_seconds() < 0.05, answered - first_byte[0]
    assert time.monotonic() - started < 1.0  # the probe did not wait for the rest


def test_a_5xx_is_no_answer_as_for_jupyterhub_and_a_4xx_is_one():
    """JupyterHub's readiness check takes a status below 500; so does the probe. A
    server that answered it 503 (not ready) and JupyterHub too, forever, was taken as
    started: never killed at http_timeout, never a failed start."""
    for status, answers in ((503, False), (500, False), (404, True), (302, True)):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = listener.getsockname()[1]
        stop = threading.Event()

        def serve(listener=listener, status=status, stop=stop) -> None:
            listener.settimeout(0.2)
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                with conn:
                    conn.recv(65536)
                    conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n".encode())

        threading.Thread(target=serve, daemon=True).start()
        try:
            answered = asyncio.run(first_answer(f"http://127.0.0.1:{port}/api", lambda: True,
                                                0.5))
        finally:
            stop.set()
            listener.close()
        assert isinstance(answered, dt.datetime) is answers, (status, answered)
