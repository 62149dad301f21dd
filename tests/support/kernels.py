"""A kernel of a researcher's server, kept running between cells (the sandbox tests
drive several at once: ada's, a second of hers, bob's)."""

from __future__ import annotations

import json
import time
import uuid
from urllib.parse import urljoin

import requests

from tests.support.hubproc import HubProcess, execute_over_websocket


class Kernel:
    """One kernel of a researcher's server, kept running between cells."""

    def __init__(self, hub: HubProcess, who: tuple[str, str]) -> None:
        token, url = who
        self.headers = {"Authorization": f"token {token}"}
        self.api = urljoin(f"{hub.url}/", url) + "api"
        r = requests.post(f"{self.api}/kernels", json={"name": "python3"},
                          headers=self.headers, timeout=60)
        r.raise_for_status()
        self.id = r.json()["id"]
        self.ws = self.api.replace("http://", "ws://") + f"/kernels/{self.id}/channels"

    def run(self, code: str, timeout: float = 60) -> str:
        return execute_over_websocket(self.ws, code, self.headers, timeout)

    def json(self, code: str, timeout: float = 60):
        return json.loads(self.run(code, timeout).strip().splitlines()[-1])

    def debug_request(self, command: str, arguments: dict) -> dict:
        """What JupyterLab sends on the control channel when its debugger is toggled on."""
        from websockets.sync.client import connect

        msg_id = uuid.uuid4().hex
        message = {
            "header": {"msg_id": msg_id, "username": "e2e", "session": uuid.uuid4().hex,
                       "msg_type": "debug_request", "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "control", "buffers": [],
            "content": {"type": "request", "seq": 1, "command": command,
                        "arguments": arguments},
        }
        with connect(self.ws, additional_headers=self.headers, open_timeout=30) as ws:
            ws.send(json.dumps(message))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                reply = json.loads(ws.recv(timeout=30))
                if (reply.get("msg_type") == "debug_reply"
                        and reply.get("parent_header", {}).get("msg_id") == msg_id):
                    return reply["content"]
        raise TimeoutError(f"no debug_reply to {command}")

    def close(self) -> None:
        try:
            requests.delete(f"{self.api}/kernels/{self.id}", headers=self.headers, timeout=30)
        except requests.RequestException:
            pass  # its server stopped
