"""The suspend warning inside JupyterLab, seen in a real headless Chromium.

A real Jupyter server with gpulease.singleuser (the environment's install, as
every notebook server has it) and the prebuilt `gpulease-notices`
labextension; a stand-in for the gpulease hub service answers its notices
(tests/test_singleuser_notices.py). The browser opens JupyterLab the way a
researcher does and must show this server's warning as a notification, and
not another server's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.test_singleuser_notices import (
    BROWSER_TOKEN,
    HUB_NOTICES,
    FakeGpuleaseService,
    Server,
)


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory) -> Iterator[Server]:
    with FakeGpuleaseService() as service:
        server = Server(tmp_path_factory.mktemp("lab"), f"http://127.0.0.1:{service.port}/hub/api")
        try:
            yield server
        finally:
            server.stop()


def test_jupyterlab_shows_this_servers_suspend_warning(lab_server, browser_context):
    page = browser_context.new_page()
    page.goto(f"{lab_server.url}lab?token={BROWSER_TOKEN}", timeout=90_000)
    page.wait_for_selector("#jp-main-dock-panel", timeout=90_000)
    warning = HUB_NOTICES["notices"][0]["message"]
    toast = page.get_by_text(re.compile(re.escape(warning) + r" \(\d+ min left\)"))
    toast.first.wait_for(timeout=60_000)
    assert page.get_by_text("another server's notice").count() == 0
    assert page.get_by_text("the default server's notice").count() == 0
