"""`GET {base_url}gpulease/activity`: kernels and terminals in one answer, for the idle culler.

The culler needs both the kernels' execution states and the terminals' last
activity of a server it is about to warn or suspend. jupyter_server serves
them as two requests; across thousands of servers that doubles the culler's
reads, so this answers both at once:

    {"kernels": [<jupyter_server kernel model>...],
     "terminals": [{"name", "last_activity"}...] | null}

`terminals` is null when the server has no terminal support. Reading it
never counts as the user's activity (a GET; see activity.py). It needs the
same permissions as listing kernels and terminals.
"""

from __future__ import annotations

import json

from jupyter_client.jsonutil import json_default
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import ensure_async, url_path_join
from tornado import web

PATH = "gpulease/activity"


class ActivityStateHandler(APIHandler):
    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def get(self) -> None:
        kernels = await ensure_async(self.kernel_manager.list_kernels())
        terminals_manager = self.settings.get("terminal_manager")
        terminals = None
        if terminals_manager is not None:
            terminals = [
                {"name": t.get("name"), "last_activity": t.get("last_activity")}
                for t in terminals_manager.list()
            ]
        self.finish(json.dumps({"kernels": kernels, "terminals": terminals},
                               default=json_default))


def setup_handlers(serverapp) -> None:
    web_app = serverapp.web_app
    route = url_path_join(web_app.settings["base_url"], PATH)
    web_app.add_handlers(".*$", [(route, ActivityStateHandler)])
