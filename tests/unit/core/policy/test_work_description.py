"""A researcher's description of their work, read from api/recommend's query (issue 48)."""

from __future__ import annotations

import pytest

from gpulease.core.model.llm_shapes import MODELS
from gpulease.core.policy.work_description import parse_parameters, workload_from_query
from gpulease.core.refusal import Refusal


@pytest.mark.parametrize(("text", "count"), [
    ("7000000000", 7_000_000_000), ("7e9", 7_000_000_000), ("7B", 7_000_000_000),
    ("1.5b", 1_500_000_000), ("350M", 350_000_000), (" 70 B ", 70_000_000_000),
])
def test_a_parameter_count_reads_as_people_write_it(text, count):
    assert parse_parameters(text) == count


@pytest.mark.parametrize("text", ["", "seven", "7 GB", "-7B", "1e30", "100"])
def test_a_parameter_count_that_is_none_is_refused(text):
    with pytest.raises(ValueError):
        parse_parameters(text)


def test_defaults_fill_what_the_description_leaves_out():
    w = workload_from_query({"model": "llama-2-7b", "task": "lora"})
    assert (w.shape, w.precision, w.batch, w.sequence, w.checkpointing, w.optimizer,
            w.lora_rank) == (MODELS["llama-2-7b"], "bf16", 1, 2048, False, "adamw", 16)
    assert workload_from_query({"model": "llama-2-7b", "task": "qlora"}).precision == "int4"


def test_every_wrong_field_is_named_at_once():
    with pytest.raises(Refusal) as refused:
        workload_from_query({"model": "nope", "task": "train", "batch": "-1", "x": "1"})
    fields = [e.field for e in refused.value.errors]
    assert fields == ["x", "model", "task", "batch"]
    assert refused.value.status == 400
