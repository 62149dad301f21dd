"""A fault-injecting proxy in front of the test API server (a test double for a bad network).

It serves TLS with the API server's own certificate (valid for 127.0.0.1) on a
port of its own and forwards every request, bearer token included, to the real
API server. Rules, added by the test while it runs, break chosen requests:

- `status`: answer with an API Status of that code instead (500, 409, 410 …);
- `drop_after`: forward, then cut the connection after that many seconds
  (a dropped watch);
- `delay`: wait that long before forwarding (a slow API server);
- `hold`: wait until the test sets this event before forwarding (a slow API server,
  for exactly as long as the test needs: no race against a fixed delay);
- `expire_watch`: answer a watch with the ERROR event a real API server sends
  when the requested resourceVersion is too old (410 Expired).

Each rule matches a method and a path regex and fires `times` times (0:
until removed). Clients must authenticate with a bearer token (a
ServiceAccount's, as the hub does); client certificates end at the proxy.
`answered` records every request's method, path?query, status and, for an
error, the API server's message (a 403 names the verb and resource refused).
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import threading
from dataclasses import dataclass

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web


@dataclass
class Fault:
    method: str  # GET, POST, … or * for any
    path: str  # a regex, searched in path?query
    status: int = 0
    drop_after: float = 0.0
    delay: float = 0.0
    hold: threading.Event | None = None
    expire_watch: bool = False
    times: int = 1  # 0: every time
    fired: int = 0

    def matches(self, method: str, target: str) -> bool:
        return (self.method in ("*", method) and re.search(self.path, target) is not None
                and (self.times == 0 or self.fired < self.times))


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


@dataclass(frozen=True)
class Answered:
    method: str
    target: str  # path?query
    status: int
    message: str = ""  # an error's body (the API Status), its first 4 kB


REASONS = {409: "AlreadyExists", 410: "Expired", 429: "TooManyRequests",
           500: "InternalError", 503: "ServiceUnavailable"}


async def _cancel_the_rest() -> None:
    """Cancel every task of the running loop but this one, and wait until they end."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=5)


class FaultProxy:
    def __init__(self, upstream: str, ca: str, cert: str, key: str):
        self.upstream = upstream
        self.faults: list[Fault] = []
        self.answered: list[Answered] = []  # appended in the proxy's thread, in order
        self.lock = threading.Lock()
        self._client_ssl = ssl.create_default_context(cafile=ca)
        self._server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._server_ssl.load_cert_chain(cert, key)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="fault-proxy")

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        """End the server, then every request still open in it (watches), and close the
        loop. A task left pending would be finalised whenever the garbage collector
        meets it, in the middle of a later test: its coroutine's clean-up then runs
        there (and on Python 3.11 a traceback formatted then, inside pytest's own
        ast.parse, ends the whole run with an INTERNALERROR)."""
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        asyncio.run_coroutine_threadsafe(self._session.close(), self._loop).result(10)
        asyncio.run_coroutine_threadsafe(_cancel_the_rest(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    def add(self, fault: Fault) -> Fault:
        with self.lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self.lock:
            self.faults.clear()

    def _take(self, method: str, target: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.matches(method, target):
                    fault.fired += 1
                    return fault
        return None

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=self._server_ssl)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]

        async def session() -> ClientSession:  # aiohttp makes clients in a running loop only
            return ClientSession(connector=TCPConnector(ssl=self._client_ssl),
                                 timeout=ClientTimeout(total=None, sock_read=None),
                                 auto_decompress=False)
        self._session = self._loop.run_until_complete(session())
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        target = request.path_qs
        fault = self._take(request.method, target)
        if fault and fault.delay:
            await asyncio.sleep(fault.delay)
        if fault and fault.hold:
            while not fault.hold.is_set():
                await asyncio.sleep(0.05)
        if fault and fault.status:
            reason = REASONS.get(fault.status, "InternalError")
            message = f"injected by the test's fault proxy: {reason}"
            self.answered.append(Answered(request.method, target, fault.status, message))
            return web.json_response(_status(fault.status, reason, message),
                                     status=fault.status)
        if fault and fault.expire_watch:
            response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            await response.prepare(request)
            event = {"type": "ERROR", "object": _status(
                410, "Expired", "too old resource version (injected by the fault proxy)")}
            await response.write(json.dumps(event).encode() + b"\n")
            return response
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("authorization", "content-type", "accept", "user-agent")}
        body = await request.read()
        async with self._session.request(request.method, self.upstream + target, data=body or None,
                                         headers=headers) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items()
                if k.lower() in ("content-type", "audit-id", "cache-control")})
            await response.prepare(request)
            if upstream.status < 400:  # a watch answers for minutes: recorded as it opens
                self.answered.append(Answered(request.method, target, upstream.status))
            cut = fault.drop_after if fault and fault.drop_after else None
            error = b""
            try:
                async with asyncio.timeout(cut):
                    async for chunk in upstream.content.iter_any():
                        if upstream.status >= 400 and len(error) < 4096:
                            error += chunk
                        await response.write(chunk)
            except TimeoutError:  # a dropped connection, as a flaky network drops it
                request.transport.close()
            if upstream.status >= 400:
                self.answered.append(Answered(request.method, target, upstream.status,
                                              error.decode(errors="replace")))
            return response
