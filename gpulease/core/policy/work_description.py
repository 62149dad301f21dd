"""A researcher's description of their work, read from a query: what the memory estimate takes.

`GET api/recommend` and the spawn page's panel send it as query parameters
(docs/rest-api.yml):

- `model`: a model gpulease knows (`gpulease.core.model.llm_shapes.MODELS`, a Hub
  name like `meta-llama/Llama-3.1-8B` works too), or
- `parameters`: its parameter count, `7000000000`, `7e9`, `7B` or `350M` (one of
  the two; a bare count gets a Llama-like shape, said in the answer);
- `task`: `inference`, `lora`, `qlora` or `full` (required);
- `precision`: `fp32`, `bf16`, `fp16`, `int8`, `int4` (default `bf16`; `int4`
  for QLoRA, the only one it takes);
- `batch` (default 1) and `sequence` (tokens per sequence, default 2048; for
  inference the tokens the KV cache holds: prompt and answer);
- `checkpointing`: `true` or `false` (default false; training only);
- `optimizer`: `adamw` (default), `adamw-bf16` or `adamw-8bit` (training only);
- `lora_rank`: the adapters' rank (default 16, LoRA and QLoRA only).

Every problem is collected and refused at once (Refusal, 400), each naming its
field and what is allowed; a parameter not in this list is refused too. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation

from gpulease.core.model.llm_shapes import MODELS, ModelShape, known_model, shape_for_parameters
from gpulease.core.policy.memory_estimate import (
    DEFAULT_LORA_RANK,
    OPTIMIZERS,
    PRECISIONS,
    TASKS,
    TRAINING_TASKS,
    Workload,
    workload_problems,
)
from gpulease.core.refusal import FieldError, Refusal
from gpulease.core.shown import shown

KEYS = ("model", "parameters", "task", "precision", "batch", "sequence", "checkpointing",
        "optimizer", "lora_rank")
DEFAULT_SEQUENCE = 2048
MAX_PARAMETERS = 10**13          # 10 trillion: beyond any single-node model
MAX_BATCH = 65_536
MAX_SEQUENCE = 10_000_000
MAX_LORA_RANK = 65_536
_COUNT = re.compile(r"^\s*([0-9]{1,15}(?:\.[0-9]{1,15})?(?:[eE][0-9]{1,2})?)\s*([kKmMbBtT]?)\s*$")
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def parse_parameters(text: str) -> int:
    """A parameter count from "7000000000", "7e9", "7B", "350M", "1.5b"."""
    match = _COUNT.match(text)
    if match is None:
        raise ValueError("a parameter count, like 7000000000, 7e9, 7B or 350M")
    try:
        value = Decimal(match.group(1)) * _SUFFIX[match.group(2).lower()]
    except InvalidOperation:
        raise ValueError("a parameter count, like 7000000000, 7e9, 7B or 350M") from None
    count = int(value)
    if not 1_000_000 <= count <= MAX_PARAMETERS:
        raise ValueError(f"between 1M and {MAX_PARAMETERS:.0e} parameters")
    return count


def _integer(problems: list[FieldError], query: Mapping[str, str], name: str, default: int,
             most: int) -> int:
    text = query.get(name)
    if text is None:
        return default
    if not re.fullmatch(r"\s*[0-9]{1,12}\s*", text) or not 1 <= int(text) <= most:
        problems.append(FieldError(name, f"a whole number from 1 to {most:,}; got {shown(text)}"))
        return default
    return int(text)


def _choice(problems: list[FieldError], query: Mapping[str, str], name: str,
            allowed: tuple[str, ...], default: str) -> str:
    text = query.get(name)
    if text is None:
        return default
    value = text.strip().lower()
    if value not in allowed:
        problems.append(FieldError(name, f"one of {', '.join(allowed)}; got {shown(text)}"))
        return default
    return value


def _shape(problems: list[FieldError], query: Mapping[str, str]) -> ModelShape | None:
    name, count = query.get("model"), query.get("parameters")
    if name is not None and count is not None:
        problems.append(FieldError("parameters", "give model or parameters, not both"))
        return None
    if name is not None:
        shape = known_model(name)
        if shape is None:
            problems.append(FieldError(
                "model", f"{shown(name)} is not a model gpulease knows; known: "
                         f"{', '.join(MODELS)} (or give its parameters instead)"))
        return shape
    if count is not None:
        try:
            return shape_for_parameters(parse_parameters(count))
        except ValueError as e:
            problems.append(FieldError("parameters", f"{e}; got {shown(count)}"))
            return None
    problems.append(FieldError("model", f"a known model ({', '.join(MODELS)}), or give "
                                        "parameters: its parameter count"))
    return None


def workload_from_query(query: Mapping[str, str]) -> Workload:
    """The Workload a query describes; Refusal (400) naming every field that is wrong."""
    problems: list[FieldError] = [
        FieldError(key, f"not a parameter of this request; allowed: {', '.join(KEYS)}")
        for key in query if key not in KEYS]
    shape = _shape(problems, query)
    if query.get("task") is None:
        problems.append(FieldError("task", f"required: one of {', '.join(TASKS)}"))
        task = "inference"
    else:
        task = _choice(problems, query, "task", TASKS, "inference")
    precision = _choice(problems, query, "precision", PRECISIONS,
                        "int4" if task == "qlora" else "bf16")
    batch = _integer(problems, query, "batch", 1, MAX_BATCH)
    sequence = _integer(problems, query, "sequence", DEFAULT_SEQUENCE, MAX_SEQUENCE)
    checkpointing = False
    if "checkpointing" in query:
        text = query["checkpointing"].strip().lower()
        if text in _TRUE:
            checkpointing = True
        elif text not in _FALSE:
            problems.append(FieldError("checkpointing",
                                       f"true or false; got {shown(query['checkpointing'])}"))
    optimizer = _choice(problems, query, "optimizer", OPTIMIZERS, "adamw")
    lora_rank = _integer(problems, query, "lora_rank", DEFAULT_LORA_RANK, MAX_LORA_RANK)
    training = task in TRAINING_TASKS
    for name in ("checkpointing", "optimizer"):
        if name in query and not training:
            problems.append(FieldError(name, f"only for training ({', '.join(TRAINING_TASKS)})"))
    if "lora_rank" in query and task not in ("lora", "qlora"):
        problems.append(FieldError("lora_rank", "only for lora and qlora"))
    if problems or shape is None:
        raise _refused(problems)
    workload = Workload(shape=shape, task=task, precision=precision, batch=batch,
                        sequence=sequence, checkpointing=checkpointing, optimizer=optimizer,
                        lora_rank=lora_rank)
    rules = [FieldError(field, message) for field, message in workload_problems(workload)]
    if rules:
        raise _refused(rules)
    return workload


def _refused(problems: list[FieldError]) -> Refusal:
    return Refusal("The work's description is not one gpulease can estimate: "
                   + "; ".join(str(p) for p in problems), problems, status=400)
