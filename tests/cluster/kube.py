"""A small synchronous Kubernetes REST client for the cluster tests and the kubelet emulator.

Plain JSON over HTTPS with the standard library: the tests say exactly which
request they make and see the API server's own answer (status, reason,
message), with nothing between. Credentials are a client certificate or a
bearer token, as in a kubeconfig.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class KubeError(Exception):
    """The API server refused a request: its HTTP status and Status object."""

    def __init__(self, status: int, body: dict[str, Any], what: str):
        self.status = status
        self.body = body
        self.reason = body.get("reason", "")
        self.message = body.get("message", "")
        super().__init__(f"{what}: {status} {self.reason}: {self.message}")


@dataclass
class Kube:
    server: str  # https://127.0.0.1:PORT
    ca: Path
    cert: Path | None = None
    key: Path | None = None
    token: str = ""
    timeout: float = 30.0
    # Who the API server records as having written (managedFields, audit): the
    # tests' own client, or the kubelet emulator, never "unknown".
    agent: str = "gpulease-test-client"
    _context: ssl.SSLContext | None = field(default=None, repr=False)

    def _ssl(self) -> ssl.SSLContext:
        if self._context is None:
            context = ssl.create_default_context(cafile=str(self.ca))
            if self.cert:
                context.load_cert_chain(str(self.cert), str(self.key))
            self._context = context
        return self._context

    def _connection(self, timeout: float | None) -> http.client.HTTPSConnection:
        url = urllib.parse.urlsplit(self.server)
        return http.client.HTTPSConnection(url.hostname, url.port, context=self._ssl(),
                                           timeout=timeout or self.timeout)

    def request(self, method: str, path: str, body: Any = None, *,
                params: dict[str, Any] | None = None,
                content_type: str = "application/json") -> dict[str, Any]:
        if params:
            path += "?" + urllib.parse.urlencode(params)
        headers = {"Accept": "application/json", "User-Agent": self.agent}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        conn = self._connection(None)
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        answer = json.loads(raw) if raw.strip().startswith(b"{") else {"message": raw.decode()}
        if response.status >= 400:
            raise KubeError(response.status, answer, f"{method} {path}")
        return answer

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        return self.request("GET", path, params=params or None)

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, body)

    def patch(self, path: str, body: dict[str, Any], *, kind: str = "merge") -> dict[str, Any]:
        types = {"merge": "application/merge-patch+json",
                 "strategic": "application/strategic-merge-patch+json"}
        return self.request("PATCH", path, body, content_type=types[kind])

    def delete(self, path: str, body: dict[str, Any] | None = None,
               missing_ok: bool = True) -> dict[str, Any] | None:
        try:
            return self.request("DELETE", path, body)
        except KubeError as e:
            if e.status == 404 and missing_ok:
                return None
            raise

    def watch(self, path: str, resource_version: str = "", timeout: float = 300,
              **params: Any) -> Iterator[dict[str, Any]]:
        """Watch events ({type, object}) of a collection until the server ends the stream."""
        query = {"watch": "1", "timeoutSeconds": int(timeout), "allowWatchBookmarks": "true",
                 **params}
        if resource_version:
            query["resourceVersion"] = resource_version
        headers = {"Accept": "application/json", "User-Agent": self.agent}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn = self._connection(timeout + 10)
        try:
            conn.request("GET", f"{path}?{urllib.parse.urlencode(query)}", headers=headers)
            response = conn.getresponse()
            if response.status >= 400:
                raise KubeError(response.status, json.loads(response.read() or b"{}"),
                                f"watch {path}")
            while line := response.readline():
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 30,
                 every: float = 0.1) -> Any:
        """Poll `check` until it returns something truthy; fail naming `what`."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = check()
            except KubeError as e:
                last = e
            else:
                if last:
                    return last
            time.sleep(every)
        raise TimeoutError(f"{what}: not within {timeout:g} s (last: {last!r})")


def pods_path(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/pods" + (f"/{name}" if name else "")
