"""Forms to a researcher's proxied web app: from her server's own origin only."""

from __future__ import annotations

from gpulease.singleuser.proxied_apps import same_origin

HOST = "ada.hub.example.org"


def test_reads_and_token_requests_pass():
    assert same_origin("GET", HOST, "https://bob.hub.example.org", None, False)
    assert same_origin("POST", HOST, None, None, True)  # a script with her token


def test_a_form_from_another_origin_or_from_nowhere_is_refused():
    assert not same_origin("POST", HOST, "https://bob.hub.example.org", None, False)
    assert not same_origin("DELETE", HOST, None, "https://bob.hub.example.org/x", False)
    assert not same_origin("POST", HOST, None, None, False)


def test_a_form_from_her_own_server_passes():
    assert same_origin("POST", HOST, f"https://{HOST}", None, False)
    assert same_origin("PUT", HOST, None, f"https://{HOST}/user/ada/proxy/8050/", False)
