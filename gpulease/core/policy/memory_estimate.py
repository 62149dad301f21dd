"""How much GPU memory a piece of work needs: the estimate behind `GET api/recommend`.

A researcher describes the work (a model, known by name or by its parameter
count; the precision of its weights; the task: inference with a KV cache, LoRA,
QLoRA or a full fine-tune; batch size and sequence length; activation
checkpointing on or off) and gets the bytes it needs on one GPU, as the sum of
the parts below, each with one line saying how it was computed. P is the
parameter count, E the embedding (and untied output head) parameters, L the
layers, h the hidden width, F the MLP's hidden width (2x its inner width for a
gated MLP such as SwiGLU), V the output width (the vocabulary), n_kv x d the
key/value heads times their width, b the batch, s the sequence length, T = b x s
the tokens of a step, and a the bytes of one activation (4 in fp32, else 2).

weights
    P x bytes per weight: fp32 4, bf16/fp16 2. int8 and int4 quantise the linear
    layers only: (P - E) x 1 (int8) or (P - E) x (0.5 + 4/64 + C_Q4) (int4: 4
    bits, an fp32 scale for every block of 64 as bitsandbytes' NF4/FP4 and
    torchao's NF4 keep, and what 4-bit runs were measured to hold beyond that),
    plus E x 2 for the embeddings and output head, which stay 16-bit (as
    transformers' bitsandbytes loaders and torchtune keep them). A quantiser that
    converts every linear layer, the output head included (LitGPT's bitsandbytes
    plugin: `quantized_head`), keeps only the embedding table, vocabulary x h, in
    16 bits. QLoRA is LoRA over an int4 base.
gradients
    Full fine-tune: one gradient per parameter, in the weights' dtype (4 bytes in
    fp32, 2 in bf16/fp16). LoRA/QLoRA: only the adapters', r x L x (the in + out
    widths of the adapted projections): a fraction of a percent of P at the usual
    ranks.
optimizer states
    AdamW keeps two moments per trained parameter: 8 bytes in fp32; in mixed
    precision (bf16/fp16 weights) also an fp32 master copy, 12 bytes in all
    (the ZeRO paper's 2 + 2 + 12 = 16 bytes a parameter). `adamw-bf16` keeps the
    moments in bf16 beside bf16 weights with no master copy (pure bf16 training,
    as torchtune and LitGPT's bf16-true do): 4 bytes. `adamw-8bit` (bitsandbytes)
    keeps 8-bit moments: 2 bytes, plus the 4-byte master copy in mixed precision.
activations (training)
    Without checkpointing every layer keeps its activations for the backward
    pass: L x T x (C_ACT x (h + F) x a [+ heads x s x (2a + 1) when attention
    is computed eagerly: the softmax output, its dropout mask and output]). With
    checkpointing a layer keeps only its input, L x T x h x a, and one layer's
    activations are rebuilt at a time: + T x (C_ACT x (h + F) x a [+ ...]).
logits (training)
    The output layer's logits for every token and what a standard cross-entropy
    keeps of them: T x V x (a + 4 + 4) bytes (the logits, the fp32 log-softmax
    kept for the backward pass, its fp32 gradient). A chunked loss (LitGPT's
    default, torchtune's CEWithChunkedOutputLoss) keeps only the logits,
    T x V x a, and upcasts one chunk at a time.
KV cache (inference)
    2 (keys and values) x L x n_kv x d x a x b x s.
prefill (inference)
    The prompt goes through one layer at a time: its hidden states and MLP
    activations, p x b x (h + F) x a for a prompt of p tokens (the whole sequence
    unless said), and the next token's logits, b x V x 4.
CUDA context
    What a process holds on the GPU beyond its tensors, as NVML (nvidia-smi)
    counts it: the CUDA runtime, its kernels and libraries, and the caching
    allocator's reserve: C_CUDA bytes.

The constants C_ACT, C_CUDA and C_Q4 are fitted to published measurements
(gpulease/core/model/memory_measurements.py) by least squares on the relative
error (`policy/memory_fit.py`), over 9 of the table's 30 rows; 18 other rows
check them, and 3 rows hold memory of a kind the formula does not describe
(their `outside`). tests/unit/core/policy/test_memory_estimate.py names the two
halves, refits the constants from the fit rows alone (they must come out as
shipped), and fails if any check row is off by more than 25 %. The fit gives
C_ACT = 3.88: a layer keeps about 3.9 activations per token for every unit of
h + F (for Llama 2 7B, 3.88 x (4096 + 2 x 11008) x 2 bytes = 203 KB a token
a layer); C_CUDA = 2.42 GB, fitted on BERT-large runs on a V100 where the same
page measures the bare CUDA context at 1.34 GB, the rest being the allocator's
reserve; C_Q4 = 0.21 bytes per 4-bit weight (LitGPT's nf4 runs hold that much
beyond the packed weights and their scales). The LitGPT rows are estimated with
the model LitGPT builds (its output head never tied to the embeddings, and
quantised with the other linear layers: `memory_fit.workload_of`).

What is not modelled: torch.compile, fused losses, offloading, Adafactor,
several GPUs, an implementation's own allocations (such as gpt-fast's square
causal mask). A paged optimizer (bitsandbytes' PagedAdamW) is counted as AdamW:
its moments stay on the GPU, paged out only when memory runs short.

Pure functions over dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulease.core.model.llm_shapes import ModelShape

PRECISIONS = ("fp32", "bf16", "fp16", "int8", "int4")
TASKS = ("inference", "lora", "qlora", "full")
OPTIMIZERS = ("adamw", "adamw-bf16", "adamw-8bit")
ATTENTIONS = ("sdpa", "eager")
LOSSES = ("standard", "chunked")
LORA_TARGETS = ("all", "qv")
TRAINING_TASKS = ("lora", "qlora", "full")

WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0, "int4": 0.5}
INT4_BLOCK = 64          # weights per fp32 scale (bitsandbytes NF4/FP4, torchao NF4)
INT4_SCALE_BYTES = 4

# Fitted (see the module docstring): never edited by hand; the test refits them.
C_ACT = 3.8824           # activations kept per token per layer, per unit of h + F
C_CUDA = 2_416_122_758   # bytes a process holds beyond its tensors (NVML's count)
C_Q4 = 0.2126            # bytes per 4-bit weight beyond the 4 bits and their scales

DEFAULT_LORA_RANK = 16


@dataclass(frozen=True)
class Workload:
    shape: ModelShape
    task: str                    # inference, lora, qlora, full
    precision: str               # fp32, bf16, fp16, int8, int4
    batch: int
    sequence: int
    checkpointing: bool = False
    optimizer: str = "adamw"     # training only
    lora_rank: int = DEFAULT_LORA_RANK
    lora_targets: str = "all"    # all linear layers, or qv: the query and value projections
    attention: str = "sdpa"      # sdpa: a fused kernel (flash / memory-efficient); eager
    prompt: int | None = None    # inference: tokens prefilled at once (None: the whole sequence)
    outputs: int = 0             # width of the output layer, if not the shape's
    loss: str = "standard"       # standard: fp32 cross-entropy over all logits; chunked
    quantized_head: bool = False  # int8/int4: the output head quantised too (else 16-bit)


@dataclass(frozen=True)
class Constants:
    act: float = C_ACT
    cuda: int = C_CUDA
    q4: float = C_Q4


FITTED = Constants()


@dataclass(frozen=True)
class Part:
    name: str
    bytes: int
    how: str


@dataclass(frozen=True)
class Estimate:
    parts: tuple[Part, ...]

    @property
    def total(self) -> int:
        return sum(part.bytes for part in self.parts)

    def part(self, name: str) -> int:
        return sum(part.bytes for part in self.parts if part.name == name)

    @property
    def allocated(self) -> int:
        """What PyTorch's allocator counts: the total without the CUDA context."""
        return self.total - self.part("cuda_context")


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _count(n: float) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    if n >= 1e6:
        return f"{n / 1e6:.1f} M"
    return f"{n:,.0f}"


def lora_parameters(shape: ModelShape, rank: int, targets: str) -> int:
    """Adapter parameters: rank x (in + out) for every adapted projection of every layer."""
    q = shape.heads * shape.head_dim
    kv = shape.kv_heads * shape.head_dim
    h = shape.hidden
    if targets == "qv":
        widths = (h + q) + (h + kv)
    else:
        widths = (h + q) + 2 * (h + kv) + (q + h)
        mlp_inputs = 2 if shape.gated_mlp else 1
        widths += mlp_inputs * (h + shape.ffn) + (shape.ffn + h)
    return rank * shape.layers * widths


def _weights(w: Workload, c: Constants) -> Part:
    shape = w.shape
    p = shape.parameters
    base = "int4" if w.task == "qlora" else w.precision
    if base in ("fp32", "bf16", "fp16"):
        per = WEIGHT_BYTES[base]
        return Part("weights", round(p * per),
                    f"{_count(p)} parameters x {per:g} bytes ({base})")
    kept = shape.vocab * shape.hidden if w.quantized_head else shape.embedding_parameters
    embeddings = min(kept, p)
    linear = p - embeddings
    if base == "int8":
        per = 1.0
        what = "1 byte (int8)"
    else:
        per = WEIGHT_BYTES["int4"] + INT4_SCALE_BYTES / INT4_BLOCK + c.q4
        what = (f"{per:.3g} bytes (4 bits, an fp32 scale per {INT4_BLOCK}, and {c.q4:.3g} "
                "seen beyond them in 4-bit runs, fitted)")
    total = linear * per + embeddings * 2
    kept_what = "embedding" if w.quantized_head or shape.tied else "embedding/head"
    return Part("weights", round(total),
                f"{_count(linear)} quantised linear parameters x {what} + {_count(embeddings)} "
                f"{kept_what} parameters x 2 bytes (kept 16-bit)")


def _compute_bytes(w: Workload) -> int:
    return 4 if w.precision == "fp32" else 2


def _training_states(w: Workload) -> list[Part]:
    shape = w.shape
    if w.task == "full":
        trained = shape.parameters
        what = f"{_count(trained)} parameters"
    else:
        trained = lora_parameters(shape, w.lora_rank, w.lora_targets)
        which = "query and value" if w.lora_targets == "qv" else "every linear"
        what = (f"{_count(trained)} adapter parameters (rank {w.lora_rank} on the {which} "
                "projections)")
    dtype = 4 if w.precision == "fp32" else 2
    mixed = dtype == 2 and w.optimizer != "adamw-bf16"
    grads = Part("gradients", trained * dtype, f"{what} x {dtype} bytes")
    if w.optimizer == "adamw":
        per = 8 + (4 if mixed else 0)
        how = "AdamW's two fp32 moments" + (" + an fp32 master copy" if mixed else "")
    elif w.optimizer == "adamw-bf16":
        per = 2 * dtype
        how = "AdamW's two moments in the weights' dtype, no master copy"
    else:
        per = 2 + (4 if mixed else 0)
        how = "8-bit AdamW's two 1-byte moments" + (" + an fp32 master copy" if mixed else "")
    states = Part("optimizer", trained * per, f"{what} x {per} bytes: {how}")
    return [grads, states]


def _per_layer_token(w: Workload, c: Constants) -> float:
    shape = w.shape
    a = _compute_bytes(w)
    per = c.act * (shape.hidden + shape.mlp_width) * a
    if w.attention == "eager":
        per += shape.heads * w.sequence * (2 * a + 1)
    return per


def _activations(w: Workload, c: Constants) -> list[Part]:
    shape = w.shape
    a = _compute_bytes(w)
    tokens = w.batch * w.sequence
    per = _per_layer_token(w, c)
    eager = " + eager attention scores" if w.attention == "eager" else ""
    if w.checkpointing:
        kept = shape.layers * tokens * shape.hidden * a
        rebuilt = tokens * per
        act = Part("activations", round(kept + rebuilt),
                   f"checkpointed: {shape.layers} layer inputs x {tokens:,} tokens x "
                   f"{shape.hidden} x {a} bytes + one layer rebuilt ({c.act:g} x (h + F){eager})")
    else:
        act = Part("activations", round(shape.layers * tokens * per),
                   f"{shape.layers} layers x {tokens:,} tokens x {c.act:g} x (h + F = "
                   f"{shape.hidden + shape.mlp_width}) x {a} bytes{eager}")
    outputs = w.outputs or shape.output_width
    if w.loss == "chunked":
        logits = Part("logits", tokens * outputs * a,
                      f"{tokens:,} tokens x {outputs:,} outputs x {a} bytes (logits kept; the "
                      "loss upcasts one chunk at a time)")
    else:
        per = a + 4 + 4
        logits = Part("logits", tokens * outputs * per,
                      f"{tokens:,} tokens x {outputs:,} outputs x {per} bytes (the logits, the "
                      "fp32 log-softmax the loss keeps, its fp32 gradient)")
    return [act, logits]


def _inference(w: Workload) -> list[Part]:
    shape = w.shape
    a = _compute_bytes(w)
    kv = 2 * shape.layers * shape.kv_heads * shape.head_dim * a * w.batch * w.sequence
    cache = Part("kv_cache", kv,
                 f"2 x {shape.layers} layers x {shape.kv_heads} KV heads x {shape.head_dim} x "
                 f"{a} bytes x {w.batch} x {w.sequence:,} tokens")
    prompt = w.sequence if w.prompt is None else w.prompt
    work = prompt * w.batch * (shape.hidden + shape.mlp_width) * a
    if w.attention == "eager":
        work += w.batch * shape.heads * prompt * prompt * 4
    outputs = w.outputs or shape.output_width
    work += w.batch * outputs * 4
    prefill = Part("prefill", round(work),
                   f"one layer's working set for a {prompt:,}-token prompt x {w.batch} "
                   f"((h + F) x {a} bytes a token) + the next token's {outputs:,} logits")
    return [cache, prefill]


def estimate(w: Workload, constants: Constants = FITTED) -> Estimate:
    """The bytes `w` needs on one GPU, part by part (see the module docstring)."""
    check_workload(w)
    parts = [_weights(w, constants)]
    if w.task == "inference":
        parts += _inference(w)
    else:
        parts += _training_states(w)
        parts += _activations(w, constants)
    parts.append(Part("cuda_context", int(constants.cuda),
                      f"the CUDA context, kernels and the allocator's reserve, "
                      f"{_gb(constants.cuda)} (fitted)"))
    return Estimate(tuple(parts))


def workload_problems(w: Workload) -> list[tuple[str, str]]:
    """(field, message) for every way `w` cannot be estimated; empty when it can."""
    problems = []
    if w.task not in TASKS:
        problems.append(("task", f"one of {', '.join(TASKS)}"))
    if w.precision not in PRECISIONS:
        problems.append(("precision", f"one of {', '.join(PRECISIONS)}"))
    elif w.task == "full" and w.precision in ("int8", "int4"):
        problems.append(("precision", "a full fine-tune trains every weight: fp32, bf16 or fp16"))
    elif w.task == "qlora" and w.precision != "int4":
        problems.append(("precision", "QLoRA quantises the base model to 4 bits: int4"))
    if w.optimizer not in OPTIMIZERS:
        problems.append(("optimizer", f"one of {', '.join(OPTIMIZERS)}"))
    elif w.optimizer == "adamw-bf16" and w.precision == "fp32" and w.task != "inference":
        problems.append(("optimizer", "adamw-bf16 keeps bf16 moments beside bf16 or fp16 "
                                      "weights: with fp32 use adamw or adamw-8bit"))
    if w.attention not in ATTENTIONS:
        problems.append(("attention", f"one of {', '.join(ATTENTIONS)}"))
    if w.loss not in LOSSES:
        problems.append(("loss", f"one of {', '.join(LOSSES)}"))
    if w.lora_targets not in LORA_TARGETS:
        problems.append(("lora_targets", f"one of {', '.join(LORA_TARGETS)}"))
    for name in ("batch", "sequence", "lora_rank"):
        value = getattr(w, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append((name, "a positive integer"))
    if w.prompt is not None and (not isinstance(w.prompt, int) or w.prompt < 1
                                 or (isinstance(w.sequence, int) and w.prompt > w.sequence)):
        problems.append(("prompt", "a positive integer no larger than the sequence"))
    return problems


def check_workload(w: Workload) -> None:
    problems = workload_problems(w)
    if problems:
        raise ValueError("; ".join(f"{field}: {message}" for field, message in problems))
