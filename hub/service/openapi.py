"""`GET api/openapi.yml`: the service's OpenAPI document (docs/rest-api.yml), public.

Public on purpose: it says nothing the source does not, and tools (schemathesis,
client generators) load it without a token. The package carries the document
as `rest-api.yml` beside this module (a link to docs/rest-api.yml in the
source tree); `servers` is rewritten to where this hub serves the service: its
own origin under a subdomain host (gpulease.site_urls), else its prefix, which a
hub with a base URL other than / moves.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from tornado import web

from gpulease.hub.service.base import BaseAPIHandler

DOCUMENT = Path(__file__).with_name("rest-api.yml")
# The one `servers` entry of docs/rest-api.yml, as written there.
SERVERS_LINE = "  - url: /services/gpulease\n"


def served_document(text: str, prefix: str) -> str:
    """The document with `servers` naming `prefix` (the service's URL prefix)."""
    if SERVERS_LINE not in text:
        raise ValueError(f"{DOCUMENT} has no servers line {SERVERS_LINE.strip()!r}")
    return text.replace(SERVERS_LINE, f"  - url: {prefix.rstrip('/') or '/'}\n", 1)


@cache
def _document(prefix: str) -> bytes:
    return served_document(DOCUMENT.read_text(encoding="utf-8"), prefix).encode("utf-8")


class OpenAPIHandler(BaseAPIHandler):
    def get(self) -> None:
        urls = self.settings.get("gpulease_urls")
        where = urls.service() if urls is not None and urls.subdomain_host else (
            self.settings.get("gpulease_prefix", "/services/gpulease/"))
        self.set_header("Content-Type", "application/yaml; charset=utf-8")
        self.finish(_document(where))


# (path relative to the service prefix, handler class); app.make_app mounts them.
ROUTES: list[tuple[str, type[web.RequestHandler]]] = [
    (r"api/openapi\.yml", OpenAPIHandler),
]
