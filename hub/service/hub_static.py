"""JupyterHub's stylesheet, served by the gpulease service for its own pages.

The service's pages look like the hub's (one site: hub/web/site_nav.py has their one
navigation bar): they link JupyterHub's own stylesheet, Bootstrap with the hub's
colours and font, and the icon font it imports. With users' servers on subdomains
the service is an origin of its own, and its pages' policy allows styles and fonts
of that origin only (pages.PageHandler), so the service serves these few files of the
installed JupyterHub itself, the same bytes the hub serves at /hub/static/. Public,
as the hub's are; nothing else of JupyterHub's static folder is served.
"""

from __future__ import annotations

import re
from pathlib import Path

from jupyterhub import __version__ as jupyterhub_version
from jupyterhub._data import DATA_FILES_PATH
from tornado import web

HUB_STATIC = Path(DATA_FILES_PATH) / "static"  # what the hub serves at /hub/static/
STYLESHEET = "css/style.min.css"
_ICONS = "components/@fortawesome/fontawesome-free/"
# the stylesheet and what it imports (tests/e2e/test_site_nav.py reads its @imports)
FILES = (
    STYLESHEET,
    _ICONS + "css/fontawesome.css",
    _ICONS + "css/solid.css",
    _ICONS + "webfonts/fa-solid-900.woff2",
)
ROUTE = "static/(" + "|".join(re.escape(f) for f in FILES) + ")"
# the pages' link: the version in the query, so a browser keeps it until JupyterHub changes
STYLESHEET_LINK = f"static/{STYLESHEET}?v={jupyterhub_version}"


class HubStaticFile(web.StaticFileHandler):
    """One of FILES (the route admits no other path)."""

    def initialize(self, **_args) -> None:  # the service's handler arguments are not for it
        super().initialize(path=str(HUB_STATIC))
