"""Placement is pure: inventories in, devices or NoFit out."""

import pytest

from gpulease.core.capacity.placement import (
    NoFit,
    Placement,
    availability,
    free_summary,
    place,
)
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import (
    DEMO_INVENTORY,
    load_declared_inventory,
    parse_declared_inventory,
)

SLICE = DeviceRequest("H200", "1g.18gb")
CARD = DeviceRequest("H200")


def _inv(nodes: dict[str, list[dict]]):
    return parse_declared_inventory(
        {"nodes": [{"name": n, "gpus": gpus} for n, gpus in nodes.items()]}, "test")


@pytest.fixture
def demo():
    return load_declared_inventory(DEMO_INVENTORY)


def _mig(node, gpu, slot, profile="1g.18gb"):
    return f"MIG-declared-{node}-{gpu}-{slot}-{profile}"


def test_request_rules():
    with pytest.raises(ValueError):
        DeviceRequest("H200", "1g.18gb", count=2)
    with pytest.raises(ValueError):
        DeviceRequest("H200", count=0)
    assert SLICE.describe() == "H200 slice 1g.18gb"
    assert DeviceRequest("H200", count=2).describe() == "2× H200 (full cards)"


def test_slice_goes_to_the_first_free_slice_in_order(demo):
    p = place(SLICE, demo, held=())
    assert isinstance(p, Placement)
    assert (p.node, p.uuids) == ("local", (_mig("local", 0, 0),))
    assert p.devices[0].mig_profile == "1g.18gb"
    assert place(SLICE, demo, held={_mig("local", 0, 0)}).uuids == (_mig("local", 0, 1),)


def test_slices_pack_onto_the_busiest_gpu():
    inv = _inv({"n": [{"model": "H200", "mig": ["1g.18gb"] * 3},
                      {"model": "H200", "mig": ["1g.18gb"] * 3}]})
    # GPU 1 already has a slice taken: the next slice goes there too, so GPU 0
    # stays whole for a larger request.
    assert place(SLICE, inv, held={_mig("n", 1, 2)}).uuids == (_mig("n", 1, 0),)
    # Other profiles held on a GPU count as busy too.
    inv2 = _inv({"n": [{"model": "H200", "mig": ["1g.18gb", "1g.18gb"]},
                       {"model": "H200", "mig": ["3g.71gb", "1g.18gb"]}]})
    assert place(SLICE, inv2, held={_mig("n", 1, 0, "3g.71gb")}).uuids == (_mig("n", 1, 1),)
    # No held devices: plain order.
    assert place(SLICE, inv2, held=()).uuids == (_mig("n", 0, 0),)


def test_full_card_is_never_a_mig_gpu(demo):
    p = place(CARD, demo, held=())
    assert p.uuids == ("GPU-declared-local-1",)
    assert p.devices[0].mig_profile is None


def test_full_cards_on_one_node_best_fit():
    inv = _inv({
        "a": [{"model": "H200"}] * 4,
        "b": [{"model": "H200"}] * 2,
        "c": [{"model": "A100-80GB"}] * 8,
    })
    two = DeviceRequest("H200", count=2)
    # b has exactly two: a stays whole for a four-card request.
    assert place(two, inv, held=()) == Placement("b", tuple(
        d for d in inv.allocatable() if d.node == "b"))
    # b busy: two cards from a, lowest indices, never split across nodes.
    p = place(two, inv, held={"GPU-declared-b-0"})
    assert (p.node, p.uuids) == ("a", ("GPU-declared-a-0", "GPU-declared-a-1"))
    four = place(DeviceRequest("H200", count=4), inv, held=())
    assert four.node == "a" and len(four.uuids) == 4


def test_full_cards_503_when_free_cards_are_split_across_nodes():
    inv = _inv({"a": [{"model": "H200"}] * 2, "b": [{"model": "H200"}] * 2})
    with pytest.raises(NoFit) as info:
        place(DeviceRequest("H200", count=2), inv, held={"GPU-declared-a-0", "GPU-declared-b-0"})
    assert info.value.status == 503
    assert info.value.message == (
        "No node has 2× H200 (full cards) free: 2 of 4 free, at most 1 on one node. "
        "Free now: 2× H200 (full cards)")


def test_503_when_every_matching_slice_is_held(demo):
    held = {_mig("local", 0, s) for s in range(7)}
    with pytest.raises(NoFit) as info:
        place(SLICE, demo, held)
    assert info.value.status == 503
    assert info.value.message == (
        "No free H200 slice 1g.18gb: 0 of 7 free. Free now: 1× H200 (full card)")
    assert str(info.value) == info.value.message


def test_422_model_absent(demo):
    with pytest.raises(NoFit) as info:
        place(DeviceRequest("A100-80GB"), demo, held=())
    assert info.value.status == 422
    assert info.value.message == (
        "No A100-80GB GPU here, so 1× A100-80GB (full card) can never be placed "
        "(GPU models here: H200).")
    with pytest.raises(NoFit) as info:
        place(SLICE, _inv({}), held=())
    assert info.value.status == 422 and "this host has no GPU" in info.value.message


def test_422_profile_not_offered(demo):
    with pytest.raises(NoFit) as info:
        place(DeviceRequest("H200", "3g.71gb"), demo, held={_mig("local", 0, 0)})
    assert info.value.status == 422
    assert info.value.message == (
        "No H200 here offers slice 3g.71gb, so it can never be placed "
        "(H200 slices here: 1g.18gb). Free now: 1× H200 (full card), 6× H200 slice 1g.18gb")
    no_mig = _inv({"n": [{"model": "H200"}]})
    with pytest.raises(NoFit) as info:
        place(SLICE, no_mig, held=())
    assert info.value.status == 422 and "no H200 here is in MIG mode" in info.value.message


def test_422_more_cards_than_any_node_has(demo):
    with pytest.raises(NoFit) as info:
        place(DeviceRequest("H200", count=2), demo, held=())
    assert info.value.status == 422
    assert info.value.message == (
        "2× H200 (full cards) on one node can never be placed (the largest node has 1 H200 "
        "full card). Free now: 1× H200 (full card), 7× H200 slice 1g.18gb")
    all_mig = _inv({"n": [{"model": "H200", "mig": []}]})
    with pytest.raises(NoFit) as info:
        place(CARD, all_mig, held=())
    assert info.value.status == 422 and "every H200 here is in MIG mode" in info.value.message


def test_free_summary_and_availability(demo):
    held = {_mig("local", 0, 0), _mig("local", 0, 1), "GPU-declared-local-1", "not-a-device"}
    assert free_summary(demo, held) == "5× H200 slice 1g.18gb"
    assert free_summary(demo, ()) == "1× H200 (full card), 7× H200 slice 1g.18gb"
    assert free_summary(_inv({}), ()) == "nothing"
    assert availability(demo, held, SLICE) == (5, 7)
    assert availability(demo, held, CARD) == (0, 1)
    assert availability(demo, (), DeviceRequest("H200", "3g.71gb")) == (0, 0)


def test_deterministic_whatever_the_order_of_held_and_nodes():
    gpus = [{"model": "H200", "mig": ["1g.18gb"] * 2}, {"model": "H200"}]
    one = _inv({"z": gpus, "a": gpus})
    other = _inv({"a": gpus, "z": gpus})
    held = ["GPU-declared-a-1", _mig("z", 0, 0)]
    results = {(place(SLICE, inv, h).uuids, place(CARD, inv, h).uuids)
               for inv in (one, other) for h in (held, list(reversed(held)), set(held))}
    assert results == {((_mig("z", 0, 1),), ("GPU-declared-z-1",))}


def test_an_inventory_is_indexed_once_for_every_request_against_it(demo, monkeypatch):
    """The spawn page asks `place` and `availability` about every profile against the same
    inventory: its devices are listed, sorted and filtered once (sorting 4,000 devices per
    profile made a page of 100 profiles take 730 ms), and the answers stay the same."""
    inventory = load_declared_inventory(DEMO_INVENTORY)
    expected = [place(r, demo, held=()).uuids for r in (SLICE, CARD)]
    listed = []
    real = type(inventory).allocatable
    monkeypatch.setattr(type(inventory), "allocatable",
                        lambda self: (listed.append(self), real(self))[1])
    for _ in range(50):
        assert [place(r, inventory, held=()).uuids for r in (SLICE, CARD)] == expected
        availability(inventory, (), SLICE)
    assert [i for i in listed if i is inventory] == [inventory]
