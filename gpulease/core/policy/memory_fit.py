"""The memory estimate against published measurements: like for like, and the constants' fit.

A measurement's run is turned into the estimate's `Workload` (`workload_of`),
and the estimate is compared with what was measured (`comparable_bytes`): the
whole estimate for NVML's "memory used" (it holds the CUDA context), the
estimate without the CUDA context for PyTorch allocator figures (allocated,
active, reserved), which never hold it. A run with a paged optimizer (bitsandbytes'
PagedAdamW: 32-bit moments in CUDA managed memory, outside PyTorch's allocator;
memory_measurements.py says why) is estimated with AdamW's states, and an allocator
figure of it is compared with the estimate without them.

`fit` finds the constants C_ACT, C_CUDA and C_Q4 of
`gpulease.core.policy.memory_estimate` that minimise the sum of squared relative
errors over the given rows. The estimate is linear in each constant, so this is
ordinary least squares on rows scaled by the measured bytes, solved exactly.

Pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulease.core.model.llm_shapes import MODELS, litgpt_shape
from gpulease.core.model.memory_measurements import PAGED_OPTIMIZERS, Measurement
from gpulease.core.policy.memory_estimate import Constants, Workload, estimate


def _optimizer(row: Measurement) -> str:
    """The estimate's optimizer for a row's: a paged AdamW keeps AdamW's two moments."""
    if not row.optimizer or row.optimizer in PAGED_OPTIMIZERS:
        return "adamw"
    return row.optimizer


def workload_of(row: Measurement) -> Workload:
    """The estimate's description of a measured run, with the model its code built: LitGPT's
    has an output head of its own (`litgpt_shape`), which its bitsandbytes plugin quantises
    with every other linear layer."""
    litgpt = row.implementation == "litgpt"
    shape = litgpt_shape(MODELS[row.model]) if litgpt else MODELS[row.model]
    return Workload(
        shape=shape, task=row.kind, precision=row.precision, batch=row.batch,
        sequence=row.sequence, checkpointing=row.checkpointing,
        optimizer=_optimizer(row), lora_rank=row.lora_rank or 16,
        lora_targets=row.lora_targets or "all", attention=row.attention, prompt=row.prompt,
        outputs=row.outputs, loss=row.loss, quantized_head=litgpt)


def comparable_bytes(row: Measurement, constants: Constants) -> int:
    """The estimate of `row`'s run, counted as its measurement counts."""
    result = estimate(workload_of(row), constants)
    if row.holds_cuda_context:
        return result.total
    if row.optimizer in PAGED_OPTIMIZERS:
        return result.allocated - result.part("optimizer")
    return result.allocated


def relative_error(row: Measurement, constants: Constants) -> float:
    """(estimate - measured) / measured."""
    return comparable_bytes(row, constants) / row.measured_bytes - 1


@dataclass(frozen=True)
class Fit:
    constants: Constants
    errors: dict[str, float]   # row id -> relative error under the fitted constants


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (a small, well-posed system)."""
    n = len(vector)
    a = [row[:] + [vector[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            raise ValueError("the fit rows do not determine every constant")
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] for i in range(n)]


def fit(rows: list[Measurement]) -> Fit:
    """Least-squares constants over `rows` (relative errors), and each row's error."""
    zero = Constants(act=0.0, cuda=0, q4=0.0)
    units = (Constants(act=1.0, cuda=0, q4=0.0), Constants(act=0.0, cuda=1, q4=0.0),
             Constants(act=0.0, cuda=0, q4=1.0))
    design: list[list[float]] = []
    target: list[float] = []
    for row in rows:
        base = comparable_bytes(row, zero)
        measured = row.measured_bytes
        design.append([(comparable_bytes(row, unit) - base) / measured for unit in units])
        target.append(1 - base / measured)
    k = len(units)
    normal = [[sum(r[i] * r[j] for r in design) for j in range(k)] for i in range(k)]
    rhs = [sum(r[i] * t for r, t in zip(design, target, strict=True)) for i in range(k)]
    act, cuda, q4 = _solve(normal, rhs)
    constants = Constants(act=act, cuda=round(cuda), q4=q4)
    return Fit(constants, {row.id: relative_error(row, constants) for row in rows})
