"""The memory estimate's documentation says what the code does (issue 48): docs/user.md's
table of parts and its fitted constants, and the constants the docstrings name."""

from __future__ import annotations

import re
from pathlib import Path

from gpulease.core.model.llm_shapes import MODELS
from gpulease.core.policy import memory_estimate, memory_fit
from gpulease.core.policy.memory_estimate import C_ACT, C_CUDA, C_Q4, Workload, estimate

ROOT = Path(__file__).resolve().parents[2]
USER = (ROOT / "docs" / "user.md").read_text()


def _row(part: str) -> str:
    return next(line for line in USER.splitlines() if line.startswith(f"| {part} |"))


def _logits_bytes_per_token_and_output(precision: str, loss: str = "standard") -> float:
    shape = MODELS["llama-3.2-1b"]
    work = Workload(shape=shape, task="full", precision=precision, batch=1, sequence=1024,
                    loss=loss)
    return estimate(work).part("logits") / (1024 * shape.vocab)


def test_the_logits_row_says_the_bytes_the_code_counts():
    row = _row("logits")
    bf16 = _logits_bytes_per_token_and_output("bf16")
    fp32 = _logits_bytes_per_token_and_output("fp32")
    assert (bf16, fp32) == (10, 12)
    assert f"tokens × vocabulary × {bf16:g} bytes, {fp32:g} in fp32" in row
    assert _logits_bytes_per_token_and_output("bf16", "chunked") == 2
    assert "chunked loss only the logits" in row


def test_the_docs_give_the_shipped_constants():
    assert f"× {C_ACT:.2f} × (hidden + MLP width)" in _row("activations")
    assert f"plus {C_Q4:.2f} byte measured" in _row("weights")
    assert _row("CUDA context").startswith(f"| CUDA context | {C_CUDA / 1e9:.2f} GB:")
    assert f"constants ({C_ACT:.2f}, {C_Q4:.2f} and {C_CUDA / 1e9:.2f} GB)" in USER
    assert f"a CUDA context ({C_CUDA / 1e9:.2f} GB) for each\ncard beyond the first" in USER


def test_the_docstrings_name_only_constants_that_exist():
    for module in (memory_estimate, memory_fit):
        named = set(re.findall(r"\bC_[A-Z0-9]+\b", module.__doc__ or ""))
        assert named, module.__name__
        assert all(hasattr(memory_estimate, name) for name in named), (module.__name__, named)
