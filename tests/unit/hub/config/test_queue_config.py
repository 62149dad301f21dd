"""gpulease sets JupyterHub's start_timeout and concurrent_spawn_limit from its queue options."""

import dataclasses

import pytest
from traitlets import TraitError

from gpulease.hub.config.app_options import GPULeaseOptions
from gpulease.hub.config.hub_config import hub_config
from tests.unit.hub.config.test_hub_config import settings


def test_a_queued_start_is_not_cut_short_nor_429(tmp_path):
    c = hub_config(settings(tmp_path))  # defaults: 30m, 500
    assert c.LocalGPUSpawner.queue_max_wait == 1800.0
    assert c.LocalGPUSpawner.start_timeout == 1800 + 60
    assert c.LocalGPUSpawner.queue_max_length == 500
    assert c.JupyterHub.concurrent_spawn_limit == 600
    s = dataclasses.replace(settings(tmp_path), queue_max_wait_s=0, queue_max_length=20)
    c = hub_config(s)
    assert c.LocalGPUSpawner.queue_max_wait == 0 and c.LocalGPUSpawner.start_timeout == 60
    assert c.JupyterHub.concurrent_spawn_limit == 120


def test_queue_max_wait_is_a_duration():
    opts = GPULeaseOptions()
    assert opts.queue_max_wait == "30m"
    opts.queue_max_wait = "1h30m"
    opts.queue_max_wait = "0"
    with pytest.raises(TraitError, match="queue_max_wait"):
        opts.queue_max_wait = "30"
