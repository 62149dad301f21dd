"""The memory estimate (issue 48): its parts, and its check against published measurements.

The estimate's constants (C_ACT, C_CUDA, C_Q4) are fitted on the rows named in FIT
below and nowhere else: `test_the_constants_are_the_fit_of_the_fit_rows_alone` refits
them from those rows and finds the shipped values, and moving any of them makes the fit
rows' squared errors larger. Every row of CHECK must then be within 25 % of what was
measured. OUTSIDE rows (each with its reason in the table) are reported, not checked.
Each CHECK and OUTSIDE row's error is also pinned to within 2 points of its value today
(PINNED): the 25 % bound alone lets a check row's figure be misread by 30 %, or C_ACT
and C_CUDA move by a third, unnoticed. Run with -s to see every row's error.
"""

from __future__ import annotations

import dataclasses

import pytest

from gpulease.core.model.llm_shapes import MODELS
from gpulease.core.model.memory_measurements import BY_ID, MEASUREMENTS
from gpulease.core.policy.memory_estimate import (
    C_ACT,
    C_CUDA,
    C_Q4,
    FITTED,
    Constants,
    Workload,
    estimate,
    lora_parameters,
    workload_problems,
)
from gpulease.core.policy.memory_fit import (
    comparable_bytes,
    fit,
    relative_error,
    workload_of,
)

# The fit half: one 4-bit inference run (C_Q4 needs one), four BERT-large runs and
# torchtune's packed Llama 3.2 3B (full fine-tunes: C_ACT, and C_CUDA from NVML's
# counts), four LitGPT runs (two LoRA, two QLoRA). 9 of the table's 30 rows.
# torchtune's packed run's optimizer is not published: the row assumes torch.optim.AdamW
# with bf16 moments (4 bytes a parameter, 12.9 GB of its 64.4 GB) from the order of the
# README's table, whose later rows add 8-bit AdamW and the fused optimizer step; the fit
# leans on that assumption for C_ACT (see the row's note and unknown).
FIT = (
    "inf-falcon-7b-nf4",
    "full-bert-large-bs4-fp32",
    "full-bert-large-bs1-ckpt-fp16",
    "full-bert-large-bs4-adam8bit",
    "full-llama32-3b-torchtune-packed",
    "lora-llama2-7b-litgpt",
    "lora-falcon-7b-litgpt",
    "qlora-llama3-8b-litgpt",
    "qlora-mistral-7b-litgpt",
)
OUTSIDE = tuple(row.id for row in MEASUREMENTS if row.outside)
CHECK = tuple(row.id for row in MEASUREMENTS if row.id not in FIT and not row.outside)
TOLERANCE = 0.25


def test_the_fit_takes_at_most_half_of_the_rows_and_no_check_row():
    assert len(FIT) <= len(MEASUREMENTS) / 2
    assert len(FIT) <= len(CHECK)
    assert set(FIT) <= set(BY_ID)
    assert not set(FIT) & set(OUTSIDE)
    assert not set(FIT) & set(CHECK)
    assert set(FIT) | set(CHECK) | set(OUTSIDE) == set(BY_ID)


def test_the_constants_are_the_fit_of_the_fit_rows_alone():
    fitted = fit([BY_ID[name] for name in FIT]).constants
    assert fitted.act == pytest.approx(C_ACT, rel=1e-4)
    assert fitted.cuda == pytest.approx(C_CUDA, rel=1e-4)
    assert fitted.q4 == pytest.approx(C_Q4, rel=1e-3)


def _squared_errors(constants: Constants) -> float:
    return sum(relative_error(BY_ID[name], constants) ** 2 for name in FIT)


@pytest.mark.parametrize("field", ["act", "cuda", "q4"])
@pytest.mark.parametrize("factor", [0.99, 1.01, 0.9, 1.1])
def test_the_shipped_constants_minimise_the_fit_rows_squared_errors(field, factor):
    # Checked without `fit`'s solver: moving any shipped constant, alone, makes the fit
    # rows' sum of squared relative errors larger.
    moved = getattr(FITTED, field) * factor
    other = dataclasses.replace(FITTED, **{field: round(moved) if field == "cuda" else moved})
    assert _squared_errors(other) > _squared_errors(FITTED)


# Each check (and outside) row's error under the shipped constants, in percent, as it is
# today: a row's figure misread, or a constant moved, moves a pinned error by more than
# PIN points. A change that means to move them restates them here, row by row.
PINNED = {
    "inf-llama31-8b-bf16-kv8k": -4.1,
    "inf-llama31-8b-bf16-kv16k": -8.1,
    "inf-llama31-8b-bf16-kv32k": -14.6,
    "inf-octocoder-bf16": -0.5,
    "inf-octocoder-int8": -3.3,
    "inf-octocoder-int4": +20.9,
    "inf-falcon-7b-fp32": -0.3,
    "inf-falcon-7b-bf16": -0.4,
    "inf-falcon-7b-int8": -13.6,
    "qlora-llama2-7b-litgpt": -11.4,
    "lora-mistral-7b-litgpt": +11.2,
    "lora-llama3-8b-litgpt": +3.6,
    "qlora-falcon-7b-litgpt": -5.3,
    "lora-llama2-7b-torchtune": -8.1,
    "full-bert-large-bs1-fp32": +6.1,
    "full-bert-large-bs1-ckpt-fp32": +11.3,
    "full-bert-large-bs4-fp16": -19.6,
    "full-bert-large-bs1-ckpt-fp16-adam8bit": +3.7,
    "inf-llama31-8b-bf16-kv64k": -26.4,
    "inf-llama31-8b-bf16-kv128k": -43.9,
    "qlora-llama2-7b-torchtune": -30.4,
}
PIN = 2.0  # percentage points


def test_every_check_and_outside_row_has_its_error_pinned():
    assert set(PINNED) == set(CHECK) | set(OUTSIDE)


@pytest.mark.parametrize("name", CHECK + OUTSIDE)
def test_a_rows_error_stays_where_it_is_pinned(name):
    error = relative_error(BY_ID[name], FITTED) * 100
    assert abs(error - PINNED[name]) <= PIN, f"{name}: {error:+.1f} %, pinned {PINNED[name]:+.1f}"


def _report(names) -> list[tuple[str, float]]:
    rows = [(name, relative_error(BY_ID[name], FITTED)) for name in names]
    for name, error in rows:
        row = BY_ID[name]
        print(f"{name:42} {row.kind:9} measured {row.measured_bytes / 1e9:6.2f} GB  "
              f"error {error * 100:+6.1f} %")
    return rows


def test_every_check_row_is_within_25_percent():
    print("\nfit rows:")
    _report(FIT)
    print("check rows:")
    rows = _report(CHECK)
    print("outside the formula (not checked):")
    _report(OUTSIDE)
    off = [(name, f"{error:+.1%}") for name, error in rows if abs(error) > TOLERANCE]
    assert not off, f"check rows off by more than 25 %: {off}"


def test_each_kind_has_at_least_four_checked_or_fitted_rows():
    used = [BY_ID[name] for name in FIT + CHECK]
    assert sum(row.kind == "inference" for row in used) >= 4
    assert sum(row.kind in ("lora", "qlora") for row in used) >= 4
    assert sum(row.kind == "full" for row in used) >= 4
    assert sum(row.kind == "inference" for row in BY_ID.values() if row.id in CHECK) >= 4


@pytest.mark.parametrize("row", MEASUREMENTS, ids=lambda row: row.id)
def test_every_measured_run_is_a_workload_the_estimate_takes(row):
    assert not workload_problems(workload_of(row))


def test_a_paged_optimizers_states_are_not_in_an_allocator_figure():
    # bitsandbytes' PagedAdamW keeps its moments in CUDA managed memory, which
    # torch.cuda.max_memory_allocated does not count: the comparison leaves them out,
    # and the estimate a researcher gets counts them as AdamW's.
    row = BY_ID["qlora-llama2-7b-litgpt"]
    assert row.optimizer == "paged-adamw" and row.measure == "allocated"
    work = workload_of(row)
    assert work.optimizer == "adamw"
    result = estimate(work)
    assert result.part("optimizer") > 0
    assert comparable_bytes(row, FITTED) == result.allocated - result.part("optimizer")
    plain = BY_ID["lora-llama2-7b-litgpt"]
    assert comparable_bytes(plain, FITTED) == estimate(workload_of(plain)).allocated


def test_litgpt_runs_are_estimated_with_the_model_litgpt_builds():
    # LitGPT's Falcon 7B keeps its output head apart (7,217,189,760 parameters), and its
    # bitsandbytes plugin quantises that head with every other linear layer: only the
    # embedding table stays 16-bit.
    vocab_by_width = 65024 * 4544
    for name in ("inf-falcon-7b-nf4", "inf-falcon-7b-int8", "qlora-falcon-7b-litgpt",
                 "lora-falcon-7b-litgpt", "inf-falcon-7b-bf16"):
        work = workload_of(BY_ID[name])
        assert work.shape.parameters == 7_217_189_760 and not work.shape.tied
        assert work.quantized_head
    nf4 = estimate(workload_of(BY_ID["inf-falcon-7b-nf4"])).part("weights")
    per = 0.5 + 4 / 64 + C_Q4
    assert nf4 == round((7_217_189_760 - vocab_by_width) * per + vocab_by_width * 2)
    int8 = estimate(workload_of(BY_ID["inf-falcon-7b-int8"])).part("weights")
    assert int8 == (7_217_189_760 - vocab_by_width) * 1 + vocab_by_width * 2
    # transformers' loaders keep the head 16-bit: the other rows are the Hub's models
    octo = workload_of(BY_ID["inf-octocoder-int4"])
    assert octo.shape is MODELS["starcoder-15b"] and not octo.quantized_head


def test_a_quantised_head_leaves_only_the_embedding_table_in_sixteen_bits():
    shape = MODELS["llama-3.1-8b"]
    kept = estimate(_llama(precision="int8")).part("weights")
    quantised = estimate(_llama(precision="int8", quantized_head=True)).part("weights")
    head = shape.vocab * shape.hidden
    assert kept - quantised == head * (2 - 1)
    assert estimate(_llama(quantized_head=True)).part("weights") == shape.parameters * 2


def _llama(**kw) -> Workload:
    defaults = dict(shape=MODELS["llama-3.1-8b"], task="inference", precision="bf16", batch=1,
                    sequence=4096)
    return Workload(**{**defaults, **kw})


def test_every_part_says_how_it_was_computed():
    for w in (_llama(), _llama(task="full", optimizer="adamw"), _llama(task="lora"),
              _llama(task="qlora", precision="int4", checkpointing=True)):
        result = estimate(w)
        assert result.total == sum(part.bytes for part in result.parts)
        assert all(part.how and part.bytes >= 0 for part in result.parts)
        assert result.part("cuda_context") == C_CUDA


def test_inference_is_weights_kv_cache_prefill_and_context():
    result = estimate(_llama())
    assert [part.name for part in result.parts] == ["weights", "kv_cache", "prefill",
                                                    "cuda_context"]
    assert result.part("weights") == 8_030_261_248 * 2
    # 2 x 32 layers x 8 KV heads x 128 x 2 bytes per token
    assert result.part("kv_cache") == 2 * 32 * 8 * 128 * 2 * 4096
    assert estimate(_llama(batch=4)).part("kv_cache") == 4 * result.part("kv_cache")


def test_a_full_fine_tune_in_mixed_precision_is_16_bytes_a_parameter_before_activations():
    result = estimate(_llama(task="full", optimizer="adamw"))
    p = 8_030_261_248
    assert result.part("weights") + result.part("gradients") + result.part("optimizer") == 16 * p
    pure = estimate(_llama(task="full", optimizer="adamw-bf16"))
    assert pure.part("optimizer") == 4 * p
    eight = estimate(_llama(task="full", optimizer="adamw-8bit"))
    assert eight.part("optimizer") == 6 * p
    fp32 = estimate(_llama(task="full", precision="fp32"))
    assert fp32.part("weights") + fp32.part("gradients") + fp32.part("optimizer") == 16 * p


def test_lora_trains_only_the_adapters():
    shape = MODELS["llama-3.1-8b"]
    result = estimate(_llama(task="lora", lora_rank=16))
    adapters = lora_parameters(shape, 16, "all")
    assert adapters < shape.parameters * 0.01
    assert result.part("gradients") == adapters * 2
    assert result.part("weights") == shape.parameters * 2
    assert lora_parameters(shape, 8, "qv") == 8 * 32 * ((4096 + 4096) + (4096 + 1024))


def test_qlora_keeps_the_linear_layers_in_four_bits_and_the_embeddings_in_sixteen():
    shape = MODELS["llama-3.1-8b"]
    result = estimate(_llama(task="qlora", precision="int4"))
    embeddings = 128256 * 4096 * 2
    per = 0.5 + 4 / 64 + C_Q4
    assert result.part("weights") == round((shape.parameters - embeddings) * per + embeddings * 2)


def test_checkpointing_keeps_layer_inputs_and_rebuilds_one_layer():
    plain = estimate(_llama(task="lora", sequence=2048, batch=2))
    kept = estimate(_llama(task="lora", sequence=2048, batch=2, checkpointing=True))
    assert kept.part("activations") < plain.part("activations") / 5
    tokens, layers, hidden = 4096, 32, 4096
    assert kept.part("activations") > layers * tokens * hidden * 2


def test_eager_attention_adds_the_square_of_the_sequence():
    sdpa = estimate(_llama(task="full", sequence=1024)).part("activations")
    eager = estimate(_llama(task="full", sequence=1024, attention="eager")).part("activations")
    assert eager - sdpa == 32 * 1024 * 32 * 1024 * 5


def test_a_chunked_loss_keeps_only_the_logits():
    standard = estimate(_llama(task="lora", sequence=1024)).part("logits")
    chunked = estimate(_llama(task="lora", sequence=1024, loss="chunked")).part("logits")
    assert chunked == 1024 * 128256 * 2
    assert standard == 1024 * 128256 * 10


@pytest.mark.parametrize(("changes", "field"), [
    ({"task": "pretrain"}, "task"),
    ({"precision": "fp8"}, "precision"),
    ({"task": "full", "precision": "int4"}, "precision"),
    ({"task": "qlora", "precision": "bf16"}, "precision"),
    ({"task": "full", "precision": "fp32", "optimizer": "adamw-bf16"}, "optimizer"),
    ({"optimizer": "sgd"}, "optimizer"),
    ({"batch": 0}, "batch"),
    ({"sequence": True}, "sequence"),
    ({"prompt": 9000}, "prompt"),
])
def test_a_workload_that_cannot_be_estimated_names_the_field(changes, field):
    problems = workload_problems(_llama(**changes))
    assert [name for name, _ in problems] == [field]
    with pytest.raises(ValueError, match=field):
        estimate(_llama(**changes))
