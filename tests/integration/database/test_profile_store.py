import dataclasses
import logging

import pytest
from sqlalchemy import select, update

from gpulease.core.model.catalog import Catalog
from gpulease.core.model.profiles import SAMPLE_PROFILES, ProfileError, load_profiles_file
from gpulease.images import shipped_catalog
from gpulease.store.db import profiles as profiles_table
from gpulease.store.db import settings
from gpulease.store.profiles import PROFILES_FILE_HASH, ApplyResult, ProfileStore

CATALOG = shipped_catalog()
SAMPLES = load_profiles_file(SAMPLE_PROFILES, CATALOG)
CPU, SLICE, FULL = SAMPLES


@pytest.fixture
def store(engine):
    return ProfileStore(engine, CATALOG)


def snapshot(engine):
    with engine.connect() as conn:
        return sorted(tuple(row) for row in conn.execute(
            select(profiles_table.c.slug, profiles_table.c.spec, profiles_table.c.enabled)))


def test_upsert_get_list_delete(store):
    assert store.list() == [] and store.get("cpu") is None
    assert store.upsert(FULL) == "created"
    assert store.upsert(SLICE) == "created"
    assert store.upsert(CPU) == "created"
    assert store.upsert(SLICE) == "unchanged"
    assert store.get("h200-1g") == SLICE
    # cheapest first
    assert [p.slug for p in store.list()] == ["cpu", "h200-1g", "h200-full"]
    dearer = dataclasses.replace(SLICE, price_per_hour_ucr=9_000_000)
    assert store.upsert(dearer) == "updated"
    assert store.get("h200-1g") == dearer
    assert [p.slug for p in store.list()] == ["cpu", "h200-full", "h200-1g"]
    assert store.delete("h200-1g") is True
    assert store.delete("h200-1g") is False
    assert [p.slug for p in store.list()] == ["cpu", "h200-full"]


def test_list_orders_equal_prices_by_slug(store):
    for slug in ("b", "a", "c"):
        store.upsert(dataclasses.replace(CPU, slug=slug))
    assert [p.slug for p in store.list()] == ["a", "b", "c"]


def test_disabled_profiles(store, engine):
    store.apply(SAMPLES)
    assert store.upsert(dataclasses.replace(FULL, enabled=False)) == "updated"
    assert [p.slug for p in store.list(include_disabled=False)] == ["cpu", "h200-1g"]
    assert store.get("h200-full").enabled is False
    assert len(store.list()) == 3
    # The column is authoritative when something toggles it directly.
    with engine.begin() as conn:
        conn.execute(update(profiles_table).where(profiles_table.c.slug == "cpu")
                     .values(enabled=False))
    assert store.get("cpu").enabled is False
    assert [p.slug for p in store.list(include_disabled=False)] == ["h200-1g"]


def test_stored_spec_is_file_form_without_slug(store, engine):
    store.upsert(SLICE)
    with engine.connect() as conn:
        spec = conn.execute(select(profiles_table.c.spec)).scalar_one()
    assert '"price_per_hour":"1.2"' in spec and '"slug"' not in spec
    assert '"memory":"32Gi"' in spec


def test_apply_created_updated_unchanged_and_prune(store):
    assert store.apply(SAMPLES) == ApplyResult(
        created=["cpu", "h200-1g", "h200-full"], updated=[], unchanged=[], deleted=[])
    assert store.apply(SAMPLES) == ApplyResult(unchanged=["cpu", "h200-1g", "h200-full"])
    cheaper = dataclasses.replace(FULL, price_per_hour_ucr=7_000_000)
    result = store.apply([CPU, cheaper])
    assert result == ApplyResult(updated=["h200-full"], unchanged=["cpu"])
    assert store.get("h200-1g") is not None  # no prune: kept
    result = store.apply([cheaper], prune=True)
    assert result == ApplyResult(unchanged=["h200-full"], deleted=["cpu", "h200-1g"])
    assert [p.slug for p in store.list()] == ["h200-full"]
    assert str(result) == "unchanged h200-full; deleted cpu, h200-1g"
    assert store.apply([], prune=True).deleted == ["h200-full"]
    assert store.list() == []


class FailingStore(ProfileStore):
    """Fails while writing one slug, after earlier rows of the batch were written."""

    fail_on = "h200-full"

    def _write(self, conn, profile):
        outcome = super()._write(conn, profile)
        if profile.slug == self.fail_on:
            raise RuntimeError("database went away")
        return outcome


def test_apply_is_all_or_nothing(store, engine):
    store.apply([CPU])
    before = snapshot(engine)
    failing = FailingStore(engine, CATALOG)
    changed_cpu = dataclasses.replace(CPU, price_per_hour_ucr=1)
    with pytest.raises(RuntimeError):
        failing.apply([changed_cpu, SLICE, FULL], prune=True)
    assert snapshot(engine) == before
    assert store.get("cpu") == CPU


def test_apply_validates_the_whole_batch_first(store, engine):
    store.apply([CPU])
    before = snapshot(engine)
    bad = dataclasses.replace(SLICE, images=("gone",))
    negative = dataclasses.replace(FULL, price_per_hour_ucr=-1)
    with pytest.raises(ProfileError) as info:
        store.apply([dataclasses.replace(CPU, price_per_hour_ucr=5), bad, negative])
    fields = [e.field for e in info.value.errors]
    assert "h200-1g: images" in fields and "h200-full: price_per_hour" in fields
    with pytest.raises(ProfileError, match="given twice"):
        store.apply([SLICE, SLICE])
    with pytest.raises(ProfileError):
        store.upsert(bad)
    assert snapshot(engine) == before


def test_stored_profile_with_retired_image_is_kept(engine, store, caplog):
    store.apply(SAMPLES)
    smaller = Catalog(tuple(i for i in CATALOG.images if i.name != "tensorrt-llm"))
    with caplog.at_level(logging.WARNING, logger="gpulease.profiles"):
        profiles = ProfileStore(engine, smaller).list()
    assert [p.slug for p in profiles] == ["cpu", "h200-1g", "h200-full"]
    assert profiles[1].images == ("pytorch", "tensorrt-llm")
    assert "tensorrt-llm" in caplog.text and "h200-1g" in caplog.text


def test_unreadable_row_is_skipped_not_fatal(engine, store, caplog):
    store.apply(SAMPLES)
    with engine.begin() as conn:
        conn.execute(update(profiles_table).where(profiles_table.c.slug == "h200-1g")
                     .values(spec='{"display_name": "x"}'))
    with caplog.at_level(logging.ERROR, logger="gpulease.profiles"):
        assert [p.slug for p in store.list()] == ["cpu", "h200-full"]
    assert store.get("h200-1g") is None
    assert "h200-1g" in caplog.text


def _hash(engine):
    with engine.connect() as conn:
        return conn.execute(
            select(settings.c.value).where(settings.c.key == PROFILES_FILE_HASH)).scalar()


def test_apply_file_if_changed(store, engine, tmp_path):
    path = tmp_path / "profiles.yaml"
    text = SAMPLE_PROFILES.read_text(encoding="utf-8")
    path.write_text(text, encoding="utf-8")
    first = store.apply_file_if_changed(path)
    assert first == ApplyResult(created=["cpu", "h200-1g", "h200-full"])
    digest = _hash(engine)
    assert digest and len(digest) == 64
    # An admin edit on the page persists while the file is unchanged.
    store.upsert(dataclasses.replace(CPU, price_per_hour_ucr=42))
    assert store.apply_file_if_changed(path) is None
    assert store.get("cpu").price_per_hour_ucr == 42
    # Any change of bytes applies again (upsert, no prune).
    store.upsert(dataclasses.replace(CPU, slug="extra"))
    path.write_text(text.replace('"8.00"', '"7.50"'), encoding="utf-8")
    result = store.apply_file_if_changed(path)
    assert result.updated == ["cpu", "h200-full"] and result.unchanged == ["h200-1g"]
    assert result.deleted == [] and store.get("extra") is not None
    assert store.get("h200-full").price_per_hour_ucr == 7_500_000
    assert _hash(engine) != digest
    assert store.apply_file_if_changed(path) is None


def test_apply_file_refuses_before_touching_the_db(store, engine, tmp_path):
    store.apply([CPU])
    before = snapshot(engine)
    path = tmp_path / "profiles.yaml"
    text = SAMPLE_PROFILES.read_text(encoding="utf-8")
    path.write_text(text.replace("1g.18gb}", "1g.10gb}"), encoding="utf-8")
    with pytest.raises(ProfileError) as info:
        store.apply_file_if_changed(path)
    assert any(e.field.endswith("profiles[1] (h200-1g): gpu.mig") for e in info.value.errors)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ProfileError, match="not UTF-8"):
        store.apply_file_if_changed(path)
    with pytest.raises(OSError):
        store.apply_file_if_changed(tmp_path / "absent.yaml")
    assert snapshot(engine) == before and _hash(engine) is None


def test_default_profile(store):
    assert store.get_default_profile("alice") is None
    store.set_default_profile("alice", "h200-1g")
    store.set_default_profile("bob", "cpu")
    assert store.get_default_profile("alice") == "h200-1g"
    store.set_default_profile("alice", "cpu")
    assert store.get_default_profile("alice") == "cpu"
    store.set_default_profile("alice", None)
    assert store.get_default_profile("alice") is None
    assert store.get_default_profile("bob") == "cpu"
