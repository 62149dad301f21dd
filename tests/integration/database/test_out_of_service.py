"""Out-of-service devices: never placed, shown, returned when their cgroup empties or by an admin.

Runs on SQLite and PostgreSQL (the `engine` fixture). The cgroup is a fake
folder whose `cgroup.procs` lists a pid that never exists: it cannot be
emptied until the test empties the file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulease.core.capacity.placement import NoFit
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import parse_declared_inventory
from gpulease.hub.service.pages.forms import inventory_counts, inventory_rows
from gpulease.hub.service.views import inventory_view
from gpulease.spawners.local import isolation, quarantine
from gpulease.spawners.local.cgroup_kill import empty_cgroup
from gpulease.spawners.queueing.runner import holdings_from
from gpulease.store.assignments import OUT_OF_SERVICE, AssignmentStore

NO_SUCH_PID = 4_194_305
CARD = DeviceRequest("H200")
ONE_GPU = parse_declared_inventory(
    {"nodes": [{"name": "box", "gpus": [{"model": "H200", "memory": "141Gi"}]}]}, "test")
GPU = "GPU-declared-box-0"


@pytest.fixture
def store(engine) -> AssignmentStore:
    return AssignmentStore(engine)


@pytest.fixture
def stuck(tmp_path) -> Path:
    folder = tmp_path / "gpulease" / "gl-eve._.t"
    folder.mkdir(parents=True)
    (folder / "cgroup.procs").write_text(f"{NO_SUCH_PID}\n")
    return folder


def _stop_with(store: AssignmentStore, folder: Path) -> list[str]:
    """What LocalGPUSpawner._release does when the cgroup cannot be emptied."""
    emptied = empty_cgroup("cgroup1", "gl-eve._.t", [str(folder)], wait_s=0.1)
    assert not emptied.empty
    return store.take_out_of_service("eve", "", "user", emptied.state(), emptied.describe())


def test_a_device_kept_by_a_stuck_cgroup_is_never_placed(store, stuck):
    store.claim("eve", "", "gpu", CARD, ONE_GPU)
    assert _stop_with(store, stuck) == [GPU]
    assert store.devices_of("eve", "") == []  # eve's assignment is closed
    held = store.held()
    assert held[GPU].state == OUT_OF_SERVICE and held[GPU].user == "eve"
    with pytest.raises(NoFit) as refused:
        store.claim("bob", "", "gpu", CARD, ONE_GPU)
    assert refused.value.status == 503
    with pytest.raises(NoFit):  # eve's own restart does not get it back either
        store.claim("eve", "", "gpu", CARD, ONE_GPU)
    assert holdings_from(held, ONE_GPU) == []  # counts against no one's limit
    record = store.out_of_service()[GPU]
    assert record.cgroup["dirs"] == [str(stuck)] and str(NO_SUCH_PID) in record.detail
    assert quarantine.leftover_pids(record) == [NO_SUCH_PID]


def test_it_shows_as_out_of_service_in_the_api_and_on_the_page(store, stuck):
    store.claim("eve", "", "gpu", CARD, ONE_GPU)
    _stop_with(store, stuck)
    view = inventory_view(ONE_GPU, store.held())
    device = view["nodes"][0]["gpus"][0]["devices"][0]
    assert device["state"] == "out_of_service" and device["holder"]["user"] == "eve"
    rows = inventory_rows(view)
    assert inventory_counts(rows)["out_of_service"] == 1 and rows[0]["state"] == "out_of_service"


def test_it_returns_by_itself_once_the_cgroup_is_empty(store, stuck):
    store.claim("eve", "", "gpu", CARD, ONE_GPU)
    _stop_with(store, stuck)

    def cleanup(cgroup):
        return isolation.cleanup(cgroup, wait_s=0.1)

    assert quarantine.recheck(store, cleanup) == []  # still there: stays out
    assert store.held()[GPU].state == OUT_OF_SERVICE
    (stuck / "cgroup.procs").write_text("")
    assert quarantine.recheck(store, cleanup) == [GPU]
    assert store.held() == {} and store.out_of_service() == {}
    assert store.claim("bob", "", "gpu", CARD, ONE_GPU).uuids == (GPU,)


def test_an_admin_returns_it(store, stuck):
    store.claim("eve", "", "gpu", CARD, ONE_GPU)
    _stop_with(store, stuck)
    returned = store.return_to_service(GPU, "admin:root")
    assert returned is not None and returned.user == "eve"
    assert store.return_to_service(GPU, "admin:root") is None
    assert store.claim("bob", "", "gpu", CARD, ONE_GPU).uuids == (GPU,)


def test_a_stale_cgroup_that_cannot_be_emptied_refuses_the_next_start(monkeypatch, stuck):
    """The next run must not share a cgroup (and its devices) with what is left."""
    from gpulease.spawners.local import cgroups

    monkeypatch.setattr(isolation, "remove_plan",
                        lambda plan, wait_s: cgroups.remove_plan(
                            cgroups.CgroupPlan(plan.kind, plan.unit, (str(stuck),), ()), 0.1))
    monkeypatch.setattr(isolation, "HostReader", lambda: type("R", (), {
        "facts": lambda self: cgroups.HostFacts(is_root=True, v1={"memory": "/m", "cpu": "/c"},
                                                writable=frozenset({"/m", "/c"}))})())
    settings = isolation.IsolationSettings(
        unix_accounts=False, policy=None, limits="cgroup1", devices=False, device_nodes={},
        state_root=str(stuck.parent), nvml=False)
    with pytest.raises(cgroups.CgroupError, match="last run cannot be ended"):
        isolation.prepare(settings, "eve", "", stuck.parent, 1, 2**28, ())
