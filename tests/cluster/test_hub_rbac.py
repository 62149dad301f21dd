"""The hub's Role and ClusterRole (spawners/kube/rbac.py) are enough, and each grant is needed.

GPUKubeSpawner runs here in-process, as JupyterHub drives it, with kubespawner's
client holding a real ServiceAccount token (TokenRequest) bound to exactly the
hub's rules, through the fault proxy, which records every answer. What the hub
does for a user: a MIG-slice start admitted to the cluster's counted capacity
(the inventory's watches of nodes and pods), the home claim made on the first
start, the pod made, the server's first answer, a poll, the pod's events (what
a waiting user sees), a stop; then the user, removed and added again, starts
with no state of the spawner's while the namespace's claim quota is full (the
create is refused; the kept claim is read back), and stops again. Throughout,
the hub's watches must hold: the inventory live, each kind listed only when a
watch begins.

With every grant this succeeds with no refusal of rights. With any single
grant removed (a verb on a resource, of the Role or of the ClusterRole) it
fails, and every refusal the API server made names that grant.

The same in DRA mode (GPUKubeSpawner.gpu_allocation "dra"), on a node whose GPUs
the test double of NVIDIA's DRA driver publishes: with the hub's rules and
DRA's (DRA_ROLE_RULES, DRA_CLUSTER_ROLE_RULES) it succeeds, its templates made
before each pod and deleted once no pod names them; with any one of DRA's
grants removed it fails, naming that grant.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlparse

import kubespawner.clients
import kubespawner.spawner
import pytest
from jupyterhub.objects import Server
from kubernetes_asyncio.client import Configuration

from gpulease.spawners.context import get_context
from gpulease.spawners.kube import cluster_runner, dra_spawner
from gpulease.spawners.kube.dra_claims import claim_spec, claim_template
from gpulease.spawners.kube.rbac import (
    DRA_CLUSTER_ROLE_RULES,
    DRA_ROLE_RULES,
    HUB_CLUSTER_ROLE_RULES,
    HUB_ROLE_RULES,
    grants,
    rules_of,
)
from gpulease.spawners.kube.spawner import GPUKubeSpawner
from tests.cluster import dra_driver
from tests.cluster.conftest import ControlPlane
from tests.cluster.faults import FaultProxy
from tests.cluster.kube import Kube
from tests.cluster.nodes import GpuNode
from tests.cluster.rbac import grant, grant_cluster, service_account_token
from tests.cluster.test_cluster_watch import eventually
from tests.cluster.test_gpu_kube_spawner import slice_choice, spawner_of
from tests.cluster.test_kubespawner import home_volume

# A stand-in for the single-user server (what is tested is the hub's rights, not
# JupyterLab): it answers any GET; the kubelet emulator binds 0.0.0.0 to the pod's IP.
STAND_IN_SERVER = (
    "import http.server as h\n"
    "class Answer(h.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(b'{}')\n"
    "h.HTTPServer(('0.0.0.0', 8888), Answer).serve_forever()\n")
EVERY_GRANT = ([("Role", *g) for g in grants(HUB_ROLE_RULES)]
               + [("ClusterRole", *g) for g in grants(HUB_CLUSTER_ROLE_RULES)])
DRA_GRANTS = ([("Role", *g) for g in grants(DRA_ROLE_RULES)]
              + [("ClusterRole", *g) for g in grants(DRA_CLUSTER_ROLE_RULES)])
DENIED = re.compile(r'cannot (\w+) resource "([\w.]+)"')  # an RBAC refusal's message
# Lists of one collection in a run: a watch that holds lists twice as it begins (kubespawner's
# reflector) and once more each 30 s; a refused watch is listed again every fraction of a second.
MOST_LISTS = 3


def rbac_refusals(proxy: FaultProxy) -> set[tuple[str, str]]:
    """(resource, verb) of every request the API server refused for want of rights."""
    refused = set()
    for answer in list(proxy.answered):
        if answer.status != 403:
            continue
        try:
            message = json.loads(answer.message)["message"]
        except (ValueError, KeyError):
            message = answer.message
        if m := DENIED.search(message):  # not a quota's 403 ("exceeded quota")
            refused.add((m.group(2), m.group(1)))
    return refused


def lists_made(proxy: FaultProxy) -> Counter:
    """How often each collection was listed (a GET of it that is not a watch)."""
    return Counter(urlparse(a.target).path for a in list(proxy.answered)
                   if a.method == "GET" and "watch=" not in a.target
                   and not re.search(r"/(persistentvolumeclaims|pods)/[^/]+$", a.target))


@pytest.fixture
async def hub_as(control_plane: ControlPlane, kube: Kube, namespace: str, proxy: FaultProxy,
                 gpu_nodes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[Callable[[list[tuple[str, str, str]]],
                                             Callable[[], GPUKubeSpawner]]]:
    """hub_as(granted) -> a maker of the hub's spawners for user ada, whose client holds a
    ServiceAccount token bound to exactly `granted` ((Role or ClusterRole, resource, verb))."""
    # a device plugin's node, and one whose GPUs NVIDIA's DRA driver (its double) publishes
    dra_node = GpuNode("h200dra", mig={"1g.18gb": 7}, dra=True)
    _plugin, made = gpu_nodes(GpuNode("h200", mig={"1g.18gb": 7}), dra_node)
    dra_driver.install(kube)
    dra_driver.publish(kube, replace(dra_node, name=made["metadata"]["name"]),
                       owner=made["metadata"]["uid"])
    storage_class, _home = home_volume(kube, control_plane, namespace)
    kube.create(f"/api/v1/namespaces/{namespace}/resourcequotas", {
        "metadata": {"name": "homes"}, "spec": {"hard": {"persistentvolumeclaims": "1"}}})
    kube.wait_for("the claim quota counted", lambda: kube.get(
        f"/api/v1/namespaces/{namespace}/resourcequotas/homes").get("status", {}).get("hard"))
    db_url = f"sqlite:///{tmp_path}/gpulease.sqlite"
    # The profile is in the hub's database, as in a hub: a start that waits in the queue
    # (the inventory has not yet seen the node) reads it again when admitted.
    stored = replace(slice_choice().profile, images=("pytorch",))
    get_context(db_url).profiles.apply([stored], actor="test")

    def bind(granted: list[tuple[str, str, str]], dra: bool = False
             ) -> Callable[[], GPUKubeSpawner]:
        token = service_account_token(kube, namespace, "hub", seconds=600)
        grant(kube, namespace, "hub", rules=rules_of(
            [(r, v) for kind, r, v in granted if kind == "Role"]))
        grant_cluster(kube, namespace, "hub", rules_of(
            [(r, v) for kind, r, v in granted if kind == "ClusterRole"]))
        _wait_applied(control_plane.as_token(token), namespace, granted)
        if dra:  # made before (by the hub, say, before a restart): the first start reads it
            template = claim_template(claim_spec(slice_choice().profile.gpu), namespace, "x")
            kube.create(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/"
                        "resourceclaimtemplates", template)
        config = Configuration(host=proxy.url)
        config.api_key = {"BearerToken": token}
        config.api_key_prefix = {"BearerToken": "Bearer"}
        config.ssl_ca_cert = control_plane.state["ca"]
        # kubespawner's clients take the default configuration: this hub's token, here.
        monkeypatch.setattr(kubespawner.spawner, "load_config", lambda **kw: None)
        monkeypatch.setattr(Configuration, "_default", config)

        def make() -> GPUKubeSpawner:
            spawner = spawner_of(namespace)
            spawner.user.groups = []
            spawner.db_url = db_url
            spawner.cmd = ["python", "-c", STAND_IN_SERVER]
            spawner.storage_class = storage_class
            spawner.storage_capacity = "1Gi"
            spawner.storage_access_modes = ["ReadWriteOnce"]
            spawner.start_timeout = spawner.http_timeout = 30
            spawner.server = Server(base_url="/user/ada/")
            spawner.gpulease_choice = slice_choice()
            if dra:
                spawner.gpu_allocation = "dra"
            return spawner
        return make

    yield bind
    for key in [k for k in GPUKubeSpawner.reflectors if namespace in k]:
        with contextlib.suppress(asyncio.CancelledError):
            await GPUKubeSpawner.reflectors.pop(key).stop()
    for key in [k for k in dra_spawner._templates if k[1] == namespace]:
        dra_spawner._templates.pop(key)
    ctx = get_context(db_url)
    for key, (owner, runner) in list(cluster_runner._runners.items()):
        if owner is ctx:
            cluster_runner._runners.pop(key)
            if runner.watch is not None:
                await runner.watch.stop()
    loop = asyncio.get_running_loop()  # kubespawner's clients of this test: their connections
    for key in [k for k in kubespawner.clients._client_cache if k[0] is loop]:
        await kubespawner.clients._client_cache.pop(key).api_client.close()
    ctx.engine.dispose()
    kube.delete(f"/api/v1/persistentvolumes/{namespace}-home")


def _wait_applied(as_hub: Kube, namespace: str, granted: list[tuple[str, str, str]]) -> None:
    """Until the authorizer grants the token exactly these (its cache lags the bindings)."""
    want = {(r, v) for _kind, r, v in granted}

    def applied() -> bool:
        review = as_hub.create("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
            "spec": {"namespace": namespace}})
        held = {(r, v) for rule in review["status"]["resourceRules"]
                for r in rule.get("resources", []) for v in rule.get("verbs", [])}
        return want <= held
    as_hub.wait_for("the hub's Role and ClusterRole applied", applied, timeout=30)


async def start(spawner: GPUKubeSpawner) -> None:
    """Start it, and keep the address it returns, as JupyterHub does."""
    where = urlparse(await asyncio.wait_for(spawner.start(), 60))
    spawner.server.ip, spawner.server.port = where.hostname, where.port


async def what_the_hub_does(make: Callable[[], GPUKubeSpawner],
                            templates_left: Callable[[], list] | None = None) -> None:
    """The hub's work for ada (see the module doc); `templates_left`: in DRA mode, the
    namespace's ResourceClaimTemplates, none of which may outlive the last stop."""
    first = make()
    await start(first)
    assert first.gpulease_answered_at is not None, "the server's first answer was not seen"
    assert await first.poll() is None, "the poll does not find the running pod"
    await eventually("the pod's Scheduled event seen (the progress a user sees)", lambda: any(
        e["reason"] == "Scheduled" for e in first.events), timeout=10)
    await asyncio.wait_for(first.stop(), 60)
    assert await first.poll() is not None, "the poll still finds the stopped pod"
    again = make()  # removed and added again: no state, the claim kept, the quota full
    await start(again)
    assert again.gpulease_answered_at is not None, "the second start's answer was not seen"
    runner = again._queue_runner()
    await asyncio.wait_for(again.stop(), 60)
    assert runner.watch is not None and not runner.watch.stale, (
        "the cluster inventory is stale: "
        + " ".join(w.last_error for w in runner.watch.watches))
    if templates_left is not None:
        await eventually("no template once no pod names it (pruned at the stop)",
                         lambda: not templates_left(), timeout=10)


def _id(g: tuple[str, str, str]) -> str:
    return f"without-{g[1]}-{g[2]}"


async def test_the_hub_runs_with_its_role_and_cluster_role(hub_as, proxy: FaultProxy):
    await what_the_hub_does(hub_as(EVERY_GRANT))
    assert rbac_refusals(proxy) == set()
    assert max(lists_made(proxy).values()) <= MOST_LISTS, lists_made(proxy)


@pytest.mark.parametrize("missing", EVERY_GRANT, ids=_id)
async def test_each_grant_is_needed(hub_as, proxy: FaultProxy, missing: tuple[str, str, str]):
    await fails_naming(missing, proxy, lambda: what_the_hub_does(
        hub_as([g for g in EVERY_GRANT if g != missing])))


async def fails_naming(missing: tuple[str, str, str], proxy: FaultProxy, flow) -> None:
    """The hub's flow without `missing` fails, and every refusal names that grant."""
    failure: BaseException | None = None
    try:
        await flow()
        lists = lists_made(proxy)
        assert max(lists.values()) <= MOST_LISTS, f"a watch did not hold: {lists}"
    except Exception as e:  # noqa: BLE001 - whatever the hub's failure, it is checked below
        failure = e
    print(f"{_id(missing)}: {type(failure).__name__}: {failure}")
    assert failure is not None, f"everything worked without {missing}"
    assert rbac_refusals(proxy) == {missing[1:]}, (
        f"refused {rbac_refusals(proxy)} (failure: {failure!r})")


def _dra_templates(kube: Kube, namespace: str) -> Callable[[], list]:
    return lambda: kube.get(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/"
                            "resourceclaimtemplates")["items"]


async def test_in_dra_mode_the_hub_runs_with_its_rules_and_dras(
        hub_as, proxy: FaultProxy, kube: Kube, namespace: str):
    await what_the_hub_does(hub_as(EVERY_GRANT + DRA_GRANTS, dra=True),
                            _dra_templates(kube, namespace))
    assert rbac_refusals(proxy) == set()
    assert max(lists_made(proxy).values()) <= MOST_LISTS, lists_made(proxy)


@pytest.mark.parametrize("missing", DRA_GRANTS, ids=_id)
async def test_in_dra_mode_each_of_dras_grants_is_needed(
        hub_as, proxy: FaultProxy, kube: Kube, namespace: str, missing: tuple[str, str, str]):
    await fails_naming(missing, proxy, lambda: what_the_hub_does(
        hub_as([g for g in EVERY_GRANT + DRA_GRANTS if g != missing], dra=True),
        _dra_templates(kube, namespace)))
