"""Keeping kubespawner's shared pod and event reflectors running (GPUKubeSpawner's mixin).

kubespawner starts one reflector of each kind for every spawner, in whichever caller
asks first; a caller cancelled during its first list, or a watch that gives up after
failing for a while, leaves a dead reflector that kubespawner keeps handing out. This
mixin starts them so that they run and restarts them when they give up
(_start_reflector says how). Its pod watch also keeps the last object of each pod
that went (PodEndReflector), so that a killed start is billed to its container's end.
"""

from __future__ import annotations

import asyncio
import itertools
from functools import partial
from typing import Any

from kubespawner import KubeSpawner
from kubespawner.spawner import PodReflector
from traitlets import validate

REFLECTOR_RESTART_PAUSES_S = (0.0, 1.0, 2.0, 5.0, 10.0)  # then 30 s each time
GONE_PODS_KEPT = 512  # the last objects of gone pods a pod watch keeps (oldest dropped)


class _GonePods(dict):
    """A pod watch's pods, which hand each pod they drop to `gone` (kubespawner's watch
    pops a pod on its DELETED event)."""

    def __init__(self, pods: dict, gone: dict[str, dict]) -> None:
        super().__init__(pods)
        self._gone = gone

    def pop(self, key, *default):
        pod = super().pop(key, *default)
        if isinstance(pod, dict):
            _keep(self._gone, key, pod)
        return pod


def _keep(gone: dict[str, dict], key: str, pod: dict) -> None:
    gone.pop(key, None)
    gone[key] = pod
    while len(gone) > GONE_PODS_KEPT:
        gone.pop(next(iter(gone)))


class PodEndReflector(PodReflector):
    """kubespawner's pod watch, which also keeps the last object of each pod that went
    (`gone`, by the same "namespace/name" key as `pods`).

    A pod deleted with a short grace is seen "deleting, running", then gone: the
    object the watch's DELETED event carries has the containers' finishedAt, but
    kubespawner drops it, and a poll that missed the last update in between had no
    end to bill to but its own moment (a killed start billed past its end).
    A pod missing from a new list (a watch restarted while it went) is kept too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.gone: dict[str, dict] = {}
        super().__init__(*args, **kwargs)

    @validate("resources")
    def _remember_gone(self, proposal: Any) -> _GonePods:
        new = proposal.value
        for key, pod in dict(getattr(self, "resources", None) or {}).items():
            if key not in new:
                _keep(self.gone, key, pod)
        return _GonePods(new, self.gone)

    def last_seen(self, key: str, uid: str | None) -> dict | None:
        """The pod of `key` (and `uid`, if given) as the watch holds it, or as it last
        was when it went (None: neither)."""
        for pod in (self.pods.get(key), self.gone.get(key)):
            if pod is not None and (uid is None or (pod.get("metadata") or {}).get("uid") == uid):
                return pod
        return None


def _never_ran(reflector: Any) -> bool:
    """A kubespawner reflector whose start ended without a watch: its first list failed."""
    return reflector.watch_task is None and reflector.first_load_future.done()


def _retrieved(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()  # not "never retrieved" when every caller was cancelled


class ReflectorUpkeep:
    """KubeSpawner's reflector start, made to run and to come back (before KubeSpawner in
    the bases)."""

    async def _start_reflector(self, kind, reflector_class, replace=False, **kwargs):
        """kubespawner's shared reflector of `kind`, started so that it runs, and restarted
        when it gives up.

        One reflector of each kind serves every spawner, and kubespawner starts it in
        whichever caller asks first, and registers it before its first list. A caller
        cancelled during that list left it registered with a first load that never
        comes and no watch: JupyterHub cancels a start's progress stream as the start
        fails, and KubeSpawner.progress is then starting the event watch (a start
        refused while the cluster's nodes could not be listed). Every later start
        then waited on it until start_timeout, logging nothing. So the start runs in a
        task of its own, which a cancelled caller leaves to finish. A reflector whose
        first list failed was handed out as it was, dead (a pod watch that never sees
        the pod: the start waits until start_timeout): it is started anew.

        kubespawner's reflector also stops for good after about 50 s of failing
        watches; kubespawner then halts the hub (user namespaces) or keeps handing
        out the dead reflector, and spawns and polls wait on a watch that sees
        nothing. Here a reflector that gave up is replaced at once."""
        if kind == "pods" and reflector_class is PodReflector:
            reflector_class = PodEndReflector
        registered = self.__class__.reflectors.get(self._get_reflector_key(kind))
        if registered is not None and _never_ran(registered):
            replace = True
        starting = asyncio.ensure_future(
            self._start_shared_reflector(kind, reflector_class, replace, **kwargs))
        starting.add_done_callback(_retrieved)  # its error is its callers', if any are left
        return await asyncio.shield(starting)

    async def _start_shared_reflector(self, kind, reflector_class, replace: bool, **kwargs):
        reflector = await KubeSpawner._start_reflector(self, kind, reflector_class,
                                                       replace=replace, **kwargs)
        reflector.on_failure = partial(self._reflector_gave_up, kind)
        return reflector

    def _reflector_gave_up(self, kind: str) -> None:
        self.log.error("kubespawner's %s watch gave up; starting a new one", kind)
        asyncio.ensure_future(self._restart_reflector(kind))

    async def _restart_reflector(self, kind: str) -> None:
        start = self._start_watching_pods if kind == "pods" else self._start_watching_events
        # until it runs: a dead reflector stays the one kubespawner hands out
        for pause in itertools.chain(REFLECTOR_RESTART_PAUSES_S, itertools.repeat(30.0)):
            await asyncio.sleep(pause)
            try:
                await start(replace=True)
            except Exception as e:  # the API server still away: pause longer, try again
                self.log.error("cannot restart the %s watch yet (%s: %s)", kind,
                               type(e).__name__, e)
            else:
                self.log.info("kubespawner's %s watch is running again", kind)
                return
