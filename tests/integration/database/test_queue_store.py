"""The queue's rows (SQLite and PostgreSQL): positions, counts per profile, cleanup."""

from gpulease.store.queue_store import QueueStore


def test_rows_positions_and_counts(engine):
    q = QueueStore(engine)
    assert q.rows() == [] and q.position("a", "") is None and q.waiting_by_profile() == {}
    q.add("a", "", "h200-1g")
    q.add("b", "train", "h200-1g")
    q.add("c", "x", "h200-2x")
    assert [(r.user, r.server, r.profile, r.position) for r in q.rows()] == [
        ("a", "", "h200-1g", 1), ("b", "train", "h200-1g", 2), ("c", "x", "h200-2x", 3)]
    assert q.position("b", "train") == 2 and q.position("b", "") is None
    assert q.waiting_by_profile() == {"h200-1g": 2, "h200-2x": 1}
    assert q.remove("a", "") is True and q.remove("a", "") is False
    assert q.position("b", "train") == 1 and q.position("c", "x") == 2


def test_adding_a_server_again_replaces_its_row_at_the_end(engine):
    q = QueueStore(engine)
    q.add("a", "", "h200-1g")
    q.add("b", "", "h200-1g")
    q.add("a", "", "h200-2x")
    assert [(r.user, r.profile) for r in q.rows()] == [("b", "h200-1g"), ("a", "h200-2x")]


def test_clear_removes_stale_rows(engine):
    q = QueueStore(engine)
    q.add("a", "", "p")
    q.add("b", "", "p")
    assert q.clear() == 2 and q.rows() == [] and q.clear() == 0


def test_kept_rows_stay_when_their_spawns_leave_as_the_hub_stops(engine):
    q = QueueStore(engine)
    q.add("a", "", "p")
    q.keep_rows()  # the hub is stopping: the next one starts them again
    assert q.remove("a", "") is False
    assert [(r.user, r.position) for r in q.rows()] == [("a", 1)]
