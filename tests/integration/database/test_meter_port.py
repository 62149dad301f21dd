"""The hub's meter is the meter the spawners declare (gpulease/core/billing/ports.py).

Spawners are typed against the Protocol, never the hub's class: this keeps the two
in step, member for member and parameter for parameter, so that a change to one
that the other does not follow fails here rather than in a running hub.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing

from gpulease.core.billing import ports
from gpulease.hub.billing.metering import Meter
from gpulease.store.sessions import SessionLedger


def protocol_methods(protocol: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(protocol).items()
            if inspect.isfunction(member) and not name.startswith("_")}


def parameters(signature: inspect.Signature) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in signature.parameters.values()]


def test_the_hubs_meter_has_every_method_the_spawners_call_with_their_parameters():
    declared = protocol_methods(ports.Meter)
    assert set(declared) == {"open", "close", "mark_alive", "preempt", "withdraw_preemption"}
    for name, signature in declared.items():
        assert parameters(inspect.signature(getattr(Meter, name))) == parameters(signature), name


def test_the_hubs_meter_has_every_attribute_the_spawners_read():
    declared = set(typing.get_type_hints(ports.Meter, vars(ports)))
    fields = {f.name for f in dataclasses.fields(Meter)}
    assert declared == {"live", "preempting", "queue_resuming", "deferred", "announce",
                        "sessions"}
    assert declared - {"sessions"} <= fields
    # made in __post_init__ from the engine: the sessions' store
    assert "self.sessions = SessionLedger(self.engine)" in inspect.getsource(Meter)


def test_the_sessions_store_answers_what_the_spawners_ask_of_it():
    for name, signature in protocol_methods(ports.SessionRecords).items():
        assert parameters(inspect.signature(getattr(SessionLedger, name))) == \
            parameters(signature), name


def test_the_spawners_context_holds_the_declared_meter():
    from gpulease.spawners.context import GPULeaseContext

    hints = typing.get_type_hints(GPULeaseContext)
    assert hints["meter"] == ports.Meter | None
