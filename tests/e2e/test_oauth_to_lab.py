"""A researcher's browser login reaches JupyterLab: one HubOAuth, from redirect to callback.

Since JupyterHub 6.0 a single-user server's `HubOAuth` keeps each pending
login's PKCE code verifier and next URL in its own memory; the
`/oauth_callback` route is bound to the instance the identity provider had
when the web app was built. gpulease's websocket-token rule (ws_token.py)
once replaced that instance after the route was bound: the login redirect
stored the verifier in the new one, the callback looked in the old one, and
every browser login ended on a 500 at `oauth_callback`.

(In process, tests/unit/singleuser/test_oauth_callback.py: after the extension
loads, the provider's `hub_auth` is the object the callback route holds.) Here a client with a cookie jar and no token
follows the hub's OAuth redirects from a deep link to a notebook, through the
real hub, proxy and JupyterLab, and lands on it with 200 and nothing else.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
import requests

# --- through the real hub, proxy and JupyterLab -------------------------------------------------

def follow(session: requests.Session, url: str, limit: int = 12) -> list[requests.Response]:
    """GET `url` and every redirect after it, by hand: each answer, in order."""
    answers = []
    for _ in range(limit):
        r = session.get(url, allow_redirects=False, timeout=60)
        answers.append(r)
        if r.status_code not in (301, 302, 303, 307, 308):
            return answers
        url = requests.compat.urljoin(url, r.headers["Location"])
    raise AssertionError(f"more than {limit} redirects: {[a.url for a in answers]}")


@pytest.mark.e2e
def test_a_logged_in_researcher_follows_a_deep_link_into_jupyterlab(hub):
    admin = hub.admin_token
    token = hub.add_user(admin, "ada")
    r = hub.api("POST", "users/ada/server", token, {"user_options": {"profile": "cpu"}})
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("ada", token)
    r = requests.put(hub.server_url("ada", "", "api/contents/x.ipynb"), timeout=30,
                     headers={"Authorization": f"token {token}"},
                     json={"type": "notebook", "format": "json", "content": {
                         "cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}})
    assert r.status_code in (200, 201), r.text

    browser = hub.login_form("ada", "ada-pw-12345")  # a cookie jar, as a browser has
    assert browser.login_status == 302
    answers = follow(browser, hub.server_url("ada", "", "lab/tree/x.ipynb"))
    trail = [f"{a.status_code} {urlsplit(a.url).path}" for a in answers]
    assert all(a.status_code < 400 for a in answers), (trail, answers[-1].text[:2000])
    # through the hub's authorization and the server's own callback, and back
    paths = [urlsplit(a.url).path for a in answers]
    assert "/hub/api/oauth2/authorize" in paths, trail
    assert "/user/ada/oauth_callback" in paths, trail
    landed = answers[-1]
    assert landed.status_code == 200, trail
    assert urlsplit(landed.url).path == "/user/ada/lab/tree/x.ipynb", trail
    # JupyterLab's own page, for ada, with the hub's prefix in its configuration
    config = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                       landed.text, re.S)
    assert config, landed.text[:2000]
    assert '"hubUser": "ada"' in config.group(1) and '"appName": "JupyterLab"' in config.group(1)
    assert "Code verifier required" not in hub.log()
