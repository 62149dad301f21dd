"""GET /hub/gpulease/site: where this hub's gpulease service and users' servers are.

The CLI given only a hub's URL (`--url`) asks here where the service is: with a
subdomain host it is not under the hub's origin (gpulease.site_urls). Public facts,
the same for everyone, so no login is needed.
"""

from __future__ import annotations

from jupyterhub.handlers import BaseHandler

from gpulease.site_urls import SiteURLs


class SiteHandler(BaseHandler):
    def initialize(self, urls: SiteURLs) -> None:
        self.urls = urls

    async def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(self.urls.origins())
