"""Start a named GPU server on gpulease, run code on a kernel there, stop it.

Only the public REST API is used: gpulease's service to create the server
with a profile, JupyterHub's API to start and stop it, and the notebook
server's own API and kernel websocket to run code. Needs `requests` and
`websockets` (pip install requests websockets).

    export GPULEASE_URL=https://gpu.example.org      # the hub
    export GPULEASE_TOKEN=...                       # a token from the hub's Token page
    python start_gpu_server.py --server train --profile h200-1g \\
        --code 'import torch; print(torch.cuda.get_device_name())'

The token needs the scopes `servers!user`, `access:servers!user`,
`read:users:name!user` (or a token with all your permissions, the default),
and `access:services!service=gpulease`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from urllib.parse import quote, urljoin

import requests
from websockets.sync.client import connect


def fail(response: requests.Response) -> None:
    try:
        message = response.json().get("message", response.text)
    except ValueError:
        message = response.text
    sys.exit(f"{response.request.method} {response.url}: {response.status_code} {message}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("GPULEASE_URL", "http://localhost:8000"))
    parser.add_argument("--server", default="script", help="name of the named server")
    parser.add_argument("--profile", default="h200-1g", help="profile slug (GET api/profiles)")
    parser.add_argument("--code", default="import os; print(os.environ['CUDA_VISIBLE_DEVICES'])")
    args = parser.parse_args()
    hub = args.url.rstrip("/")
    api = requests.Session()
    api.headers["Authorization"] = f"token {os.environ['GPULEASE_TOKEN']}"

    r = api.get(f"{hub}/hub/api/user")
    r.ok or fail(r)
    user = quote(r.json()["name"], safe="")
    server = f"{hub}/hub/api/users/{user}/servers/{args.server}"
    # Users' servers and the gpulease service have origins of their own
    # (https://alice.gpu.example.org/, https://gpulease--service.gpu.example.org/): the hub
    # says where the service is, and each server's URL comes with the server.
    service = requests.get(f"{hub}/hub/gpulease/site").json()["service"]

    # 1. Create the named server with its profile (validated, not started). If it
    #    exists already (and is stopped), replace its saved options.
    body = {"name": args.server, "user_options": {"profile": args.profile}}
    r = api.post(f"{service}api/servers", json=body)
    if r.status_code == 409 and "already has" in r.json()["message"]:
        r = api.post(f"{service}api/servers", json={**body, "replace": True})
    r.ok or fail(r)

    # 2. Start it with an empty body: the saved profile is used. Refusals (no
    #    credit, no capacity, a profile you may not use) come back here.
    r = api.post(server)
    r.status_code in (201, 202) or fail(r)

    # 3. Follow the spawn progress (profile and price, queue position) until ready.
    with api.get(f"{server}/progress", stream=True, timeout=None) as events:
        for line in events.iter_lines(decode_unicode=True):
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            print("progress:", event.get("message", ""), flush=True)
            if event.get("failed"):
                sys.exit("the server failed to start")
            if event.get("ready"):
                break
    model = api.get(f"{hub}/hub/api/users/{user}").json()["servers"][args.server]
    url = urljoin(hub + "/", model["url"])  # absolute under subdomains, else a path

    # 4. A kernel, and the code run on it through the kernel websocket.
    r = api.post(f"{url}api/kernels", json={"name": "python3"})
    r.ok or fail(r)
    kernel = r.json()["id"]
    msg_id = uuid.uuid4().hex
    request = {
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "script",
                   "session": uuid.uuid4().hex, "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": args.code, "silent": False, "store_history": False,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
    }
    ws_url = url.replace("http", "ws", 1) + f"api/kernels/{kernel}/channels"
    with connect(ws_url, additional_headers=dict(api.headers), open_timeout=60) as ws:
        ws.send(json.dumps(request))
        while True:
            reply = json.loads(ws.recv(timeout=600))
            if reply["parent_header"].get("msg_id") != msg_id:
                continue
            kind = reply["header"]["msg_type"]
            if kind == "stream":
                print("output:", reply["content"]["text"], end="", flush=True)
            elif kind == "error":
                print("error:", reply["content"]["ename"], reply["content"]["evalue"])
            elif kind == "status" and reply["content"]["execution_state"] == "idle":
                break

    # 5. Stop it: billing stops, the GPU is released, the server and its profile stay.
    api.delete(f"{url}api/kernels/{kernel}")
    r = api.delete(server)
    r.status_code in (202, 204) or fail(r)
    while args.server in api.get(f"{hub}/hub/api/users/{user}").json()["servers"]:
        time.sleep(0.5)  # stopping (202): wait until it is gone from the running servers
    sessions = api.get(f"{service}api/usage").json()["sessions"]
    last = [s for s in sessions if s["server"] == args.server][-1]
    print(f"stopped {args.server}: {last['profile']}, {last['billed_ms'] / 1000:.3f} s billed, "
          f"{last['cost']} credits")


if __name__ == "__main__":
    main()
