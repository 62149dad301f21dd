"""The published GPU-memory measurements (issue 48) and the model shapes they name.

Every row states its conditions and where its figure is published; the model table's
parameter counts are the model cards' figures.
"""

from __future__ import annotations

import re

import pytest

from gpulease.core.model.llm_shapes import (
    MODELS,
    known_model,
    litgpt_shape,
    shape_for_parameters,
)
from gpulease.core.model.memory_measurements import (
    BY_ID,
    IMPLEMENTATIONS,
    KINDS,
    MEASUREMENTS,
    OPTIMIZERS,
    UNITS,
)


def test_the_table_has_twelve_rows_or_more_four_of_each_kind():
    kinds = [row.kind for row in MEASUREMENTS]
    assert len(MEASUREMENTS) >= 12
    assert kinds.count("inference") >= 4
    assert kinds.count("lora") + kinds.count("qlora") >= 4
    assert kinds.count("full") >= 4
    assert len(BY_ID) == len(MEASUREMENTS)


def test_a_row_counts_its_figure_in_the_unit_it_was_published_in():
    assert BY_ID["full-bert-large-bs4-fp32"].measured_bytes == 14949 * 1024**2
    assert BY_ID["inf-falcon-7b-bf16"].measured_bytes == 14_500_000_000
    assert BY_ID["full-llama32-3b-torchtune-packed"].measured_bytes == round(60.0 * 1024**3)
    assert BY_ID["full-bert-large-bs4-fp32"].holds_cuda_context
    assert not BY_ID["inf-falcon-7b-bf16"].holds_cuda_context


@pytest.mark.parametrize("row", MEASUREMENTS, ids=lambda row: row.id)
def test_every_row_states_its_conditions_and_source(row):
    assert row.kind in KINDS
    assert row.model in MODELS
    assert row.unit in UNITS
    assert row.measure in ("allocated", "active", "reserved", "nvml")
    assert row.url.startswith("https://")
    assert row.where and row.framework and row.gpu and row.note
    assert float(row.published) > 0
    assert row.batch >= 1 and row.sequence >= 1
    if row.kind == "inference":
        assert row.optimizer == "" and row.prompt is not None
    else:
        assert row.optimizer in OPTIMIZERS
    if row.kind in ("lora", "qlora"):
        assert row.lora_rank >= 1 and row.lora_targets in ("qv", "all")
    if row.outside:
        assert "GB" in row.outside
    assert row.implementation in IMPLEMENTATIONS
    assert (row.implementation == "litgpt") == ("litgpt" in row.framework.lower()
                                                 or "lit-gpt" in row.framework.lower())


def test_the_model_table_matches_the_model_cards():
    # The figures each model card states.
    assert MODELS["llama-2-7b"].parameters == 6_738_415_616
    assert MODELS["llama-3.1-8b"].parameters == 8_030_261_248
    assert MODELS["mistral-7b"].parameters == 7_241_732_096
    assert MODELS["llama-3.2-1b"].parameters == 1_235_814_400
    assert MODELS["llama-3.2-3b"].parameters == 3_212_749_824
    assert MODELS["qwen2.5-7b"].parameters == 7_615_616_512
    for shape in MODELS.values():
        assert shape.source.startswith("https://huggingface.co/")
        assert shape.heads * shape.head_dim >= shape.hidden * 0.5
        assert shape.heads % shape.kv_heads == 0


def test_known_models_are_found_by_their_names():
    assert known_model("meta-llama/Llama-2-7b-hf") is MODELS["llama-2-7b"]
    assert known_model("Llama-3.1-8B") is MODELS["llama-3.1-8b"]
    assert known_model("bigcode/octocoder") is MODELS["starcoder-15b"]
    assert known_model("gpt-17") is None


def test_a_bare_parameter_count_gets_a_llama_like_shape():
    shape = shape_for_parameters(7_000_000_000)
    assert shape.assumed
    assert shape.hidden == 4224 and shape.layers == 33
    assert 0.8 < 12 * shape.layers * shape.hidden**2 / 7e9 < 1.2
    assert shape.kv_heads == shape.heads
    with pytest.raises(ValueError):
        shape_for_parameters(0)




def test_litgpts_qlora_runs_name_the_paged_adamw_they_used():
    # litgpt/finetune/lora.py at 5895df10: bnb.optim.PagedAdamW whenever bitsandbytes
    # quantises the model; torch.optim.AdamW only without it.
    litgpt = [row for row in MEASUREMENTS if row.framework.startswith("LitGPT")]
    assert {row.optimizer for row in litgpt if row.kind == "qlora"} == {"paged-adamw"}
    assert {row.optimizer for row in litgpt if row.kind == "lora"} == {"adamw-bf16"}
    for row in litgpt:
        assert ("PagedAdamW" in row.note) == (row.kind == "qlora")
        assert ("torch.optim.AdamW" in row.note) == (row.kind == "lora")


def test_litgpt_builds_falcon_with_an_output_head_of_its_own():
    # LitGPT's GPT: lm_head beside transformer.wte, never tied (the Hub's Falcon ties them).
    hub = MODELS["falcon-7b"]
    assert hub.tied and hub.parameters == 6_921_720_704
    lit = litgpt_shape(hub)
    assert not lit.tied and lit.parameters == 7_217_189_760
    assert lit.embedding_parameters == 2 * 65024 * 4544
    assert litgpt_shape(MODELS["llama-2-7b"]) is MODELS["llama-2-7b"]  # untied already


def test_every_github_source_is_pinned_to_a_commit():
    # A page on main changes; the figures are cited where they were read.
    for row in MEASUREMENTS:
        if "github.com" in row.url:
            assert re.search(r"github\.com/[^/]+/[^/]+/blob/[0-9a-f]{7,40}/", row.url), row.id


def test_what_a_source_does_not_publish_is_said_to_be_assumed():
    packed = BY_ID["full-llama32-3b-torchtune-packed"]
    assert "optimizer, not published" in packed.unknown
    assert "not published" in packed.note and "assumes" in packed.note
    # lora_finetune.rst's 15.57 GB row is at ff594c23, not at the cited 0914d5cf
    lora = BY_ID["lora-llama2-7b-torchtune"]
    assert "0914d5cf" in lora.url and "ff594c23" in lora.where
