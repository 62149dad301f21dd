"""Migrations are history: their ids and content stay as released, wherever the folder moves,
and a database made by them upgrades to today's schema with its rows intact.

tests/data/database-0011.sql is a SQLite database made by the migrations up to 0011
(`sqlite3 .dump`: a ledger grant to ada and the shipped sample profiles), kept as
text so a review sees what it holds. A later migration must carry it forward.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import text

from gpulease.core.model.profiles import SAMPLE_PROFILES, load_profiles_file
from gpulease.images import shipped_catalog
from gpulease.store.db import MIGRATIONS_DIR, make_engine, sqlite_url, upgrade
from gpulease.store.ledger import Ledger
from gpulease.store.profiles import ProfileStore

DUMP_0011 = Path(__file__).resolve().parents[1] / "data" / "database-0011.sql"
# sha256 of each released migration. A new migration adds a line; none changes one.
RELEASED = {
    "0001_initial.py": "981b7d5c691618209f7e9b7bec958d4574b5098a7c6da582eb5fc6c478c20cb8",
    "0002_billing.py": "5b2d5f70eb8e203d7fe5e15eda58e816b0f2acf1b324fd1da2c83488b9881f36",
    "0003_notices.py": "236a0744232d74fd23c12b6b567745be0cbd6ceb3b3a56dcd296c50c5be203c9",
    "0004_admin.py": "c2f78662ed52d132423b881e361c929246fbd98570909c0aa805235a6dd533e1",
    "0005_out_of_service.py": "9d4d38b6b185d969de6c3e9b4048e9beba605a58ead02393eab13bd3ae034f60",
    "0006_billed_ms.py": "b3764e6af3287b413d77c80f80747f3e689f8b329b9f8beb7e5121d89f570607",
    "0007_identities.py": "2ffed50b5f856edaf535f0ef948bef031cfbca28ba1631dd39311755b80e8fa0",
    "0008_session_tier.py": "5bd1c190bbbc431aea6ab54b470ca74dd98ae091a2efe028f3a8cf1ce4397bf8",
    "0009_session_preemption.py": "bb5e6167bb0ae0750fabc5411701947126df4e4ec3f19380f09c8dd13f8f4e44",
    "0010_reservations.py": "0e84234940e7bc40046de0644a5378e6a4890ff1f789f7f2b10c78fea3a1b4ba",
    "0011_failed_starts.py": "709f78e1f3937a98e13cb9f4a1fbbefa8b8d9f4862f5dc625630bf917f985f17",
    "0012_failed_start_tail.py": "47e701e171512560061b84804ded0b8a793a85c74fcbb958aa713ec328837c58",
    "0013_session_gpu_stats.py": "5ccef8078bf26c8855e4ba9ebefb335b030e07e02c1ae5360007e03aa8e2cdf7",
    "0014_session_gpu_coverage.py": "a459342b09d70ed317480853aac3f46f8186a5045d33a5d1fb4b2ddd53b81193",
}


def scripts() -> ScriptDirectory:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return ScriptDirectory.from_config(config)


def test_released_migrations_keep_their_ids_and_content():
    versions = MIGRATIONS_DIR / "versions"
    changed = [name for name, digest in RELEASED.items()
               if hashlib.sha256((versions / name).read_bytes()).hexdigest() != digest]
    assert not changed, f"released migrations were edited (add a new one instead): {changed}"
    ids = {rev.revision: Path(rev.path).name for rev in scripts().walk_revisions()}
    for name in RELEASED:
        assert ids.get(name.split("_", 1)[0]) == name, (name, ids)
    # one line of history, oldest first, the released ones at its start
    chain = [rev.revision for rev in reversed(list(scripts().walk_revisions()))]
    assert chain[:len(RELEASED)] == [n.split("_", 1)[0] for n in RELEASED]


def test_a_database_made_by_the_released_migrations_upgrades_with_its_rows(tmp_path):
    path = tmp_path / "gpulease.sqlite"
    with sqlite3.connect(path) as made:
        made.executescript(DUMP_0011.read_text())
    engine = make_engine(sqlite_url(path))
    try:
        upgrade(engine)
        with engine.connect() as conn:
            version = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        assert version == scripts().get_current_head()
        assert Ledger(engine).balance("ada") == 5_000_000
        catalog = shipped_catalog()
        slugs = {p.slug for p in ProfileStore(engine, catalog).list()}
        assert slugs == {p.slug for p in load_profiles_file(SAMPLE_PROFILES, catalog)}
    finally:
        engine.dispose()
