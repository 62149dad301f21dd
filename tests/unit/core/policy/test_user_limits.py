"""Per-user limits as pure decisions: named servers, CPU-only totals, queue places,
the span of usage queries and the bound on request bodies (issue 12, item 2).

The same limits are attacked on a real hub in tests/e2e/test_user_limits.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from decimal import Decimal

import pytest
from tornado.httputil import HTTPHeaders, HTTPServerRequest
from traitlets import TraitError

from gpulease.core.capacity.queue import queue_places_refusal
from gpulease.core.policy.cpu_totals import (
    CpuOnlyServer,
    cpu_only_refusal,
    parse_cores_cap,
    parse_memory_cap,
)
from gpulease.host.state import StateDir
from gpulease.hub.config.app_options import GPULeaseOptions
from gpulease.hub.config.hub_config import HubSettings, hub_config
from gpulease.hub.service import billing_views as bv
from gpulease.hub.service.body_limit import MAX_BODY_BYTES, DeclaresTooMuch, declared_length
from gpulease.hub.web.named_servers import NAMED_SERVER_LIMIT, named_server_refusal, refusing_limit
from gpulease.spawners.start.admission_options import AdmissionOptions

GI = 2**30


# --- named servers ---------------------------------------------------------------------


def test_the_sixth_named_server_is_refused_naming_the_limit():
    five = {"", "a", "b", "c", "d", "e"}  # the default server is no named server
    message = named_server_refusal("ada", five, "f", NAMED_SERVER_LIMIT)
    assert message is not None
    assert "named_server_limit_per_user 5" in message and "ada already has 5" in message
    assert "(a, b, c, d, e)" in message and "f is not created" in message
    assert named_server_refusal("ada", five - {"e"}, "f", 5) is None  # the fifth is fine


def test_existing_and_default_servers_and_no_limit_are_never_refused():
    five = {"a", "b", "c", "d", "e"}
    assert named_server_refusal("ada", five, "a", 5) is None  # restarting one of them
    assert named_server_refusal("ada", five, "", 5) is None  # the default server
    assert named_server_refusal("ada", five, "f", 0) is None  # 0: JupyterHub's "no limit"


def test_up_sets_five_and_hands_the_spawner_its_limits(tmp_path):
    base = HubSettings(state=StateDir(tmp_path), db_url="sqlite:///x", inventory_file="",
                       catalog_file="", node_name="box", admin_name="admin", service_port=1,
                       cli_token="t", proxy_token="p", chp_command=None)
    c = hub_config(base)
    assert c.JupyterHub.named_server_limit_per_user == NAMED_SERVER_LIMIT == 5
    assert (c.LocalGPUSpawner.queue_places_per_user, c.LocalGPUSpawner.cpu_only_cpu_per_user,
            c.LocalGPUSpawner.cpu_only_memory_per_user) == (3, "16", "64Gi")
    c = hub_config(dataclasses.replace(base, queue_places_per_user=1, cpu_only_cpu_per_user="4",
                                       cpu_only_memory_per_user="0"))
    assert (c.LocalGPUSpawner.queue_places_per_user, c.LocalGPUSpawner.cpu_only_cpu_per_user,
            c.LocalGPUSpawner.cpu_only_memory_per_user) == (1, "4", "0")


async def test_the_limit_handed_to_jupyterhub_asks_a_configured_callable_first():
    asked = []

    def configured(handler):  # JupyterHub's documented form: a callable of the handler
        asked.append(handler)
        return 7

    async def configured_async(handler):
        return 3

    wrapped = refusing_limit(configured)
    page = object()  # not a handler that creates servers (the home page shows the limit)
    # a number or a plain callable: answered at once (no await between JupyterHub's
    # count and the server it then creates)
    assert wrapped(page) == 7 and asked == [page]
    assert refusing_limit(5)(page) == 5
    assert await refusing_limit(configured_async)(page) == 3
    assert wrapped.gpulease_configured is configured


# --- CPU-only totals ---------------------------------------------------------------------


def _servers(*sizes: tuple[str, int, int]) -> list[CpuOnlyServer]:
    return [CpuOnlyServer(name, Decimal(cpu), memory * GI) for name, cpu, memory in sizes]


def test_the_seventeenth_core_is_refused_naming_the_limit_and_the_servers():
    running = _servers(("a", 8, 8), ("b", 8, 8))
    message = cpu_only_refusal("ada", "c", Decimal(1), GI, running, Decimal(16), 64 * GI)
    assert message is not None
    assert "cpu_only_cpu_per_user 16 cores" in message
    assert "16 cores held, this start asks for 1 core more" in message
    assert "ada/a, ada/b" in message and "memory" not in message  # only the limit it passes
    assert cpu_only_refusal("ada", "c", Decimal("0.5"), GI, _servers(("a", 8, 8)),
                            Decimal(16), 64 * GI) is None


def test_memory_counts_on_its_own():
    running = _servers(("", 1, 40))
    message = cpu_only_refusal("ada", "big", Decimal(1), 40 * GI, running, Decimal(16), 64 * GI)
    assert message is not None
    assert "cpu_only_memory_per_user 64Gi: 40Gi held, this start asks for 40Gi more" in message
    assert "ada/(default)" in message and "cpu_only_cpu" not in message


def test_a_restart_does_not_count_what_it_gives_up_and_none_means_no_limit():
    running = _servers(("a", 16, 64))
    assert cpu_only_refusal("ada", "a", Decimal(16), 64 * GI, running, Decimal(16), 64 * GI) is None
    assert cpu_only_refusal("ada", "b", Decimal(99), 999 * GI, running, None, None) is None
    # exactly at the limit is allowed
    assert cpu_only_refusal("ada", "b", Decimal(0), 0, running, Decimal(16), 64 * GI) is None


def test_a_single_start_larger_than_the_limit_is_refused():
    message = cpu_only_refusal("ada", "", Decimal(32), GI, [], Decimal(16), 64 * GI)
    assert message is not None and "0 cores held, this start asks for 32 cores more" in message
    assert "Held by: none" in message


def test_caps_parse_with_zero_as_no_limit():
    assert parse_cores_cap("16") == Decimal(16) and parse_cores_cap("500m") == Decimal("0.5")
    assert parse_cores_cap("0") is None and parse_memory_cap("0") is None
    assert parse_memory_cap("64Gi") == 64 * GI
    for bad in ("lots", "-1", ""):
        with pytest.raises(ValueError, match="0 for no limit"):
            parse_cores_cap(bad)
        with pytest.raises(ValueError, match="0 for no limit"):
            parse_memory_cap(bad)


@pytest.mark.parametrize("cls", [GPULeaseOptions, AdmissionOptions])
def test_the_options_have_one_default_and_refuse_bad_values(cls):
    options = cls()
    assert (options.cpu_only_cpu_per_user, options.cpu_only_memory_per_user,
            options.queue_places_per_user) == ("16", "64Gi", 3)
    settings = HubSettings.__dataclass_fields__  # what `up` hands the spawner, by default
    assert settings["cpu_only_cpu_per_user"].default == "16"
    assert settings["cpu_only_memory_per_user"].default == "64Gi"
    assert settings["queue_places_per_user"].default == 3
    with pytest.raises(TraitError, match="cpu_only_cpu_per_user"):
        cls(cpu_only_cpu_per_user="many")
    with pytest.raises(TraitError, match="cpu_only_memory_per_user"):
        cls(cpu_only_memory_per_user="64 GB")


def test_queue_places_per_user_must_not_be_negative():
    with pytest.raises(TraitError, match="queue_places_per_user"):
        GPULeaseOptions(queue_places_per_user=-1)


# --- queue places ------------------------------------------------------------------------


def test_the_fourth_queue_place_is_refused_naming_the_limit():
    waiting = [("ada", "a"), ("bob", ""), ("ada", "b"), ("ada", "")]
    message = queue_places_refusal("ada", waiting, 3)
    assert message is not None
    assert "queue_places_per_user 3" in message and "3 places held by" in message
    assert "ada/a, ada/b, ada/(default)" in message
    assert queue_places_refusal("bob", waiting, 3) is None
    assert queue_places_refusal("ada", waiting[:3], 3) is None
    assert queue_places_refusal("ada", waiting, 0) is None  # no limit


# --- usage queries -----------------------------------------------------------------------

NOW = dt.datetime(2026, 3, 17, 12, 30)


def test_no_range_is_the_current_utc_month():
    assert bv.usage_period(None, None, NOW) == (dt.datetime(2026, 3, 1), dt.datetime(2026, 4, 1))
    assert bv.usage_period("", "", dt.datetime(2026, 12, 31, 23, 59)) == (
        dt.datetime(2026, 12, 1), dt.datetime(2027, 1, 1))


def test_a_bound_left_out_is_the_current_months():
    assert bv.usage_period("2026-02-10", None, NOW) == (dt.datetime(2026, 2, 10),
                                                        dt.datetime(2026, 4, 1))
    assert bv.usage_period(None, "2026-03-05", NOW) == (dt.datetime(2026, 3, 1),
                                                        dt.datetime(2026, 3, 5))


def test_366_days_are_allowed_and_more_is_refused_naming_the_limit():
    assert bv.usage_period("2024-01-01", "2025-01-01", NOW)  # 2024 is a leap year: 366 days
    with pytest.raises(bv.PeriodError) as e:
        bv.usage_period("2024-01-01", "2025-02-05", NOW)
    assert e.value.field == "until"
    assert "at most 366 days" in e.value.message and "is 401 days" in e.value.message
    assert "2024-01-01T00:00:00Z" in e.value.message
    with pytest.raises(bv.PeriodError) as e:  # only since: until is the month's end
        bv.usage_period("2000-01-01", None, NOW)
    assert e.value.field == "since" and "2026-04-01T00:00:00Z" in e.value.message
    assert "until, left out" in e.value.message


def test_an_end_before_the_start_is_refused():
    with pytest.raises(bv.PeriodError) as e:
        bv.usage_period("2026-03-10", "2026-03-09", NOW)
    assert e.value.field == "until" and "later than since" in e.value.message
    with pytest.raises(bv.PeriodError) as e:  # until before this month, since left out
        bv.usage_period(None, "2026-01-01", NOW)
    assert "since, left out, is 2026-03-01T00:00:00Z" in e.value.message
    with pytest.raises(bv.PeriodError) as e:
        bv.usage_period("soon", None, NOW)
    assert e.value.field == "since"


# --- request bodies ----------------------------------------------------------------------


def _request(**headers: str) -> HTTPServerRequest:
    return HTTPServerRequest(method="PUT", uri="/services/gpulease/api/profiles",
                             headers=HTTPHeaders(headers))


def test_a_declared_body_over_one_mib_is_matched_before_it_is_read():
    over = DeclaresTooMuch()
    assert MAX_BODY_BYTES == 1 << 20
    assert over.match(_request(**{"Content-Length": str(2 << 20)})) == {}
    assert over.match(_request(**{"Content-Length": str(1 << 20)})) is None
    assert over.match(_request()) is None  # chunked or no body: the server's backstop
    assert over.match(_request(**{"Content-Length": "12, 12"})) is None
    assert declared_length(HTTPHeaders({"Content-Length": "x"})) is None  # tornado's 400
    # Unicode digits are digits to str.isdigit, not to int: no ValueError here.
    assert declared_length(HTTPHeaders({"Content-Length": "\u00b2"})) is None
