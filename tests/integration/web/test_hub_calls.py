"""BaseAPIHandler.hub_call: the hub's errors, and its absence, become gpulease refusals.

A real tornado server runs a handler of the service's base class; the "hub"
is a second tornado app answering as JupyterHub does (JSON {"status", "message"}),
or a closed port.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from tornado import httpclient, web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from gpulease.core.refusal import Refusal
from gpulease.hub.service.base import BaseAPIHandler


class FakeHub(web.RequestHandler):  # stands in for JupyterHub's REST API (named as a double)
    def get(self, code: str):
        self.set_status(int(code))
        self.finish(json.dumps({"status": int(code), "message": f"hub says {code}"}))


class Caller(BaseAPIHandler):
    async def get(self, code: str):
        answer = await self.hub_call("GET", f"/answer/{code}", doing="answer the test",
                                     answers={404: lambda _: None,
                                              409: lambda m: Refusal.of_field("name", m, 409)})
        self.write_json({"answer": answer})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(app: web.Application) -> tuple[HTTPServer, int]:
    server = HTTPServer(app)
    sockets = bind_sockets(0, "127.0.0.1")
    server.add_sockets(sockets)
    return server, sockets[0].getsockname()[1]


def ask(code: str, hub_up: bool = True) -> tuple[int, dict]:
    async def go() -> tuple[int, dict]:
        hub, hub_port = serve(web.Application([(r"/answer/(\d+)", FakeHub)]))
        if not hub_up:
            hub.stop()
            hub_port = closed_port()
        service, port = serve(web.Application([(r"/call/(\d+)", Caller, {
            "ctx": None, "hub_api_url": f"http://127.0.0.1:{hub_port}", "hub_api_token": "t"})]))
        try:
            r = await httpclient.AsyncHTTPClient().fetch(f"http://127.0.0.1:{port}/call/{code}",
                                                         raise_error=False, request_timeout=20)
            return r.code, json.loads(r.body)
        finally:
            service.stop()
            hub.stop()
    return asyncio.run(go())


@pytest.mark.parametrize("code, status, message, errors", [
    ("409", 409, "hub says 409", [{"field": "name", "message": "hub says 409"}]),
    ("500", 502, "The hub did not answer the test: hub says 500", []),
    ("403", 502, "The hub did not answer the test: hub says 403", []),
])
def test_the_hubs_errors_become_refusals_named_by_what_was_asked(code, status, message,
                                                                 errors):
    got, body = ask(code)
    assert (got, body) == (status, {"status": status, "message": message, "errors": errors})


def test_an_answer_that_means_absent_is_returned_as_none():
    assert ask("404") == (200, {"answer": None})


def test_a_hub_that_cannot_be_reached_is_a_502_not_a_bare_500():
    got, body = ask("200", hub_up=False)
    assert got == 502
    assert body["message"].startswith("The hub did not answer the test: it cannot be reached")
