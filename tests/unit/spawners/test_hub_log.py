"""gpulease's loggers write through the hub's handlers in a hub process (spawners/hub_log)."""

from __future__ import annotations

import io
import logging

import pytest

from gpulease.spawners.hub_log import GPULEASE_LOGGER, join_hub_log

BARE_ROOT = logging.Logger("bare-root")  # a hub process's root logger: no handlers


@pytest.fixture
def bare_process(monkeypatch):
    """A fresh gpulease logger."""
    ours = logging.getLogger(GPULEASE_LOGGER)
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "propagate", True)
    monkeypatch.setattr(ours, "level", logging.NOTSET)


def hub_log(name: str) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("[%(levelname)s %(asctime)s %(name)s] %(message)s"))
    log = logging.getLogger(name)
    log.handlers = [handler]
    log.setLevel(logging.INFO)
    return log, out


def test_gpuleases_info_and_warnings_reach_the_hub_log_with_its_format(bare_process):
    log, out = hub_log("test-hub-a")
    join_hub_log(log, BARE_ROOT)
    join_hub_log(log, BARE_ROOT)  # once: a second spawner adds nothing
    logging.getLogger("gpulease.queue").info("alice/ admitted")
    logging.getLogger("gpulease.cluster").warning("the nodes watch failed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("[INFO ") and lines[0].endswith("gpulease.queue] alice/ admitted")
    assert lines[1].startswith("[WARNING ") and "the nodes watch failed" in lines[1]


def test_a_process_with_logging_of_its_own_is_left_be(bare_process):
    root = logging.Logger("configured-root")
    root.addHandler(logging.NullHandler())
    log, _out = hub_log("test-hub-b")
    join_hub_log(log, root)
    assert logging.getLogger(GPULEASE_LOGGER).handlers == []
