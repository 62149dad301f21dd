"""What servers push to the gpulease service: whose server a token is, validation, the store.

The end-to-end side (a real hub, a real server pushing, another user's token
refused) is in tests/e2e/test_culler.py.
"""

from datetime import UTC, datetime, timedelta

import pytest

from gpulease.hub.service.activity_store import (
    MAX_KERNELS,
    ActivityStore,
    PushError,
    parse_push,
    server_of,
)

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)
# What the hub's GET /hub/api/user answers for a server token (JupyterHub 6).
SERVER_TOKEN_MODEL = {
    "kind": "user", "name": "ada", "admin": False, "token_id": "a12", "session_id": None,
    "scopes": ["access:servers!server=ada/gpu", "access:services!service=gpulease",
               "read:users:activity!user=ada", "users:activity!user=ada"],
}


def test_the_server_is_the_tokens_own():
    assert server_of(SERVER_TOKEN_MODEL) == ("ada", "gpu")
    default = {**SERVER_TOKEN_MODEL, "scopes": ["access:servers!server=ada/"]}
    assert server_of(default) == ("ada", "")


@pytest.mark.parametrize("model", [
    # a personal token: every server of its owner, so no one server
    {"kind": "user", "name": "ada", "scopes": ["access:servers!user=ada", "self"]},
    # an admin's token: everyone's servers
    {"kind": "user", "name": "root", "admin": True,
     "scopes": ["access:servers", "access:servers!server=ada/gpu"]},
    # a scope for another user's server (JupyterHub would not grant it; refused anyway)
    {"kind": "user", "name": "ada", "scopes": ["access:servers!server=bob/"]},
    {"kind": "user", "name": "ada", "scopes": ["access:services!service=gpulease"]},
    {"kind": "service", "name": "gpulease-culler", "scopes": ["access:servers"]},
])
def test_a_token_that_is_not_one_servers_own_is_refused(model):
    with pytest.raises(PushError) as e:
        server_of(model)
    assert e.value.status == 403 and "own token (JUPYTERHUB_API_TOKEN)" in e.value.message


def test_a_push_is_validated_field_by_field():
    body = {"kernels": [{"id": "k1", "execution_state": "busy", "connections": 1,
                         "last_activity": "2030-01-01T11:59:00.123Z"}],
            "terminals": [{"name": "1", "last_activity": "2030-01-01T11:00:00Z"}]}
    push = parse_push(body, "ada", "gpu", NOW)
    assert (push.user, push.server, push.pushed) == ("ada", "gpu", NOW)
    assert push.kernels[0].execution_state == "busy" and push.terminals == 1
    assert push.view()["kernels"][0]["last_activity"] == "2030-01-01T11:59:00.123Z"
    assert parse_push({"kernels": [], "terminals": None}, "ada", "", NOW).terminals is None
    # A server cannot report activity after the moment it reports.
    future = {"kernels": [{"id": "k", "execution_state": "idle", "connections": 0,
                           "last_activity": "2099-01-01T00:00:00Z"}]}
    assert parse_push(future, "ada", "", NOW).kernels[0].last_activity == NOW

    with pytest.raises(PushError) as e:
        parse_push({"user": "bob", "server": "", "kernels": [
            {"id": "", "execution_state": "BUSY!", "connections": -1,
             "last_activity": "yesterday", "extra": 1}], "terminals": "none"},
            "ada", "", NOW)
    fields = {f for f, _ in e.value.errors}
    assert fields == {"user", "server", "kernels[0].id", "kernels[0].execution_state",
                      "kernels[0].connections", "kernels[0].last_activity",
                      "kernels[0].extra", "terminals"}
    assert e.value.status == 400
    assert "a push names no user or server" in dict(e.value.errors)["user"]
    assert "None" not in e.value.message
    with pytest.raises(PushError, match="at most 1000"):
        parse_push({"kernels": [{}] * (MAX_KERNELS + 1)}, "ada", "", NOW)
    with pytest.raises(PushError, match="kernels: must be a list"):
        parse_push({}, "ada", "", NOW)


@pytest.mark.parametrize("moment", ["0001-01-01T00:00:00+01:00", "0001-01-01T00:59:59+01:00"])
def test_a_time_before_year_one_in_utc_is_refused_not_a_500(moment):
    """Found describing PUT api/server-activity for schemathesis: such a time parsed, and
    writing the push out (`as_json`, in `ActivityStore.put`) overflowed: a 500."""
    body = {"kernels": [{"id": "k", "execution_state": "idle", "last_activity": moment}],
            "terminals": [{"last_activity": moment}]}
    with pytest.raises(PushError) as e:
        parse_push(body, "ada", "", NOW)
    assert dict(e.value.errors) == {"kernels[0].last_activity": f"{moment} is out of range",
                                    "terminals[0].last_activity": f"{moment} is out of range"}
    earliest = {"kernels": [{"id": "k", "execution_state": "idle",
                             "last_activity": "0001-01-01T00:00:00-01:00"}]}
    assert parse_push(earliest, "ada", "", NOW).view()["kernels"][0]["last_activity"] == \
        "0001-01-01T01:00:00.000Z"


def test_the_store_keeps_the_latest_push_bounded_per_user_and_forgets_old_ones():
    store = ActivityStore(since=NOW, per_user=3)
    for i in range(5):
        store.put(parse_push({"kernels": []}, "ada", f"s{i}", NOW + timedelta(seconds=i)))
    store.put(parse_push({"kernels": []}, "bob", "", NOW))
    assert [p.server for p in store.pushes(NOW, {"ada"})] == ["s2", "s3", "s4"]
    assert store.get("bob", "") is not None and store.get("ada", "s0") is None
    later = NOW + timedelta(hours=7)
    store.put(parse_push({"kernels": []}, "ada", "s3", later))
    assert [(p.user, p.server) for p in store.pushes(later)] == [("ada", "s3")]


def test_a_push_carries_any_kernels_last_activity_shut_down_ones_too():
    body = {"kernels": [], "terminals": None, "last_kernel_activity": "2030-01-01T11:58:00Z"}
    push = parse_push(body, "ada", "", NOW)
    assert push.view()["last_kernel_activity"] == "2030-01-01T11:58:00.000Z"
    assert parse_push({"kernels": []}, "ada", "", NOW).view()["last_kernel_activity"] is None
    with pytest.raises(PushError) as e:
        parse_push({"kernels": [], "last_kernel_activity": "soon"}, "ada", "", NOW)
    assert dict(e.value.errors) == {
        "last_kernel_activity": "soon is not an ISO 8601 timestamp"}
    with pytest.raises(PushError) as e:
        parse_push({"kernels": [], "extra": 1}, "ada", "", NOW)
    assert "allowed: kernels, terminals, last_kernel_activity" in dict(e.value.errors)["extra"]
