"""Published GPU-memory measurements of real runs: what the memory estimate is checked against.

Each row is one run somebody measured and published: the model, the task
(inference with a KV cache, LoRA, QLoRA or a full fine-tune), precision, batch,
sequence length, optimizer, whether activations were checkpointed, the
framework, the GPU, the peak it reported and exactly where (`url`, `where`). A
row keeps the figure as published (`published`, `unit`) and what was measured
(`measure`): PyTorch's caching allocator's peak of allocated, active or reserved
bytes, which hold no CUDA context, or NVML's "memory used" of the whole card
(nvidia-smi), which does. `unknown` names each condition the source does not
state; `note` says how a stated condition was read. `implementation` says whose
code built the model: LitGPT's differs from the Hub's config (its output head is
never tied to the embeddings, and its bitsandbytes plugin quantises that head too),
and its rows are estimated with the model it builds.

How rows were chosen. Sources were read for runs whose conditions are stated
in the source itself or fixed by the config or script it names (the config at
the commit the figure was published from); every row's conditions are quoted
from there, never filled in by guess. A run was taken when its source states
every input the estimate takes (model, task, precision, batch, sequence length,
optimizer, checkpointing), and left out when it used a memory technique the
estimate has no input for (torch.compile, fused losses, activation or optimizer
offloading, the optimizer step fused into the backward pass, Adafactor,
tensor/pipeline parallelism, DeepSpeed).

A paged optimizer is kept, as what it is (`optimizer="paged-adamw"`): LitGPT's
QLoRA runs (litgpt/finetune/lora.py at 5895df10, lines 180-185) use bitsandbytes'
`bnb.optim.PagedAdamW` whenever bitsandbytes quantisation is on. It is not
offloading: it keeps two 32-bit moments per trained parameter, allocated for
every tensor of 100,000 elements or more in CUDA managed (unified) memory
(`bitsandbytes.functional.get_paged`, cudaMallocManaged), which stays on the GPU
and is paged out to the CPU only under memory pressure. That memory is outside
PyTorch's caching allocator, so the runs' `torch.cuda.max_memory_allocated` does
not count it: every adapter tensor of those runs has 100,000 elements or more
(rank 32 on the query and value projections: lora_A 64 x the model width, lora_B
(query + value widths) x 32, the smallest Falcon 7B's 4608 x 32), and their
moments, 2 x 4 bytes x 13.6-16.8 M adapter parameters (0.11-0.13 GB, 0.6-1.2 %
of each figure), are in no figure. The comparison (`policy/memory_fit.py`) leaves
the optimizer's part out of such a row's estimate; a researcher's estimate
counts it, as the GPU holds it. Seen and left out:

- torchtune's README tables (Llama 3.1 8B and 70B, "Memory and training speed";
  every "Optimization flags" row after "+ Packed Dataset"): torch.compile,
  chunked cross-entropy, activation offloading or fused optimizer steps; its
  "Baseline" row: unpacked Alpaca, so the sequence length of the peak batch is
  not stated.
- The Hugging Face PEFT README's table (T0_3B, mt0-xxl, bloomz-7b1 on an A100
  80GB): the precision and which of the script's printed figures the README
  rounds to "GB" are not stated (the accelerate launch config is not published);
  T0_3B and mt0-xxl are encoder-decoder models with two sequence lengths.
- LitGPT's config-hub full fine-tunes on one A10G: the published peaks (Llama
  3.2 3B 16.51 GB, Phi-3 mini 17.01 GB) are below what AdamW's parameters,
  gradients and moments alone take under the stated config (bf16-true AdamW:
  8 bytes a parameter, 25.7 GB for Llama 3.2 3B), so the published conditions
  cannot be the measured run's.
- "Optimizing your LLM in production" / the transformers guide's long-prompt
  runs (37.7 and 32.6 GB): the prompt's token count is not stated.
- The QLoRA paper's memory figures (its Figure 6 is a computed breakdown, not a
  measurement) and the DeepSpeed ZeRO paper's 16 bytes a parameter (a formula).
- The bitsandbytes 4-bit blog's table (it reports OOM or not, no peaks);
  Unsloth's tables (context lengths that fit, not peaks at stated settings).

`outside` marks a row kept in the table whose run holds memory of a kind the
estimate does not describe, with what it is and how much; such rows are
neither fitted nor checked, and the test reports their error. Which rows fit
the estimate's constants and which check them is said in
tests/unit/core/policy/test_memory_estimate.py.

Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 10**9
GiB = 1024**3
MiB = 1024**2

UNITS = {"GB": GB, "GiB": GiB, "MiB": MiB}
MEASURES = ("allocated", "active", "reserved", "nvml")
KINDS = ("inference", "lora", "qlora", "full")
IMPLEMENTATIONS = ("hf", "litgpt")
# The estimate's optimizers, and bitsandbytes' PagedAdamW (32-bit moments in CUDA managed
# memory, which PyTorch's allocator does not count: see the module docstring).
OPTIMIZERS = ("adamw", "adamw-bf16", "adamw-8bit", "paged-adamw")
PAGED_OPTIMIZERS = ("paged-adamw",)


@dataclass(frozen=True)
class Measurement:
    id: str
    kind: str            # inference, lora, qlora, full
    model: str           # key in gpulease.core.model.llm_shapes.MODELS
    precision: str       # weights: fp32, bf16, fp16, int8, int4
    batch: int
    sequence: int        # tokens per sequence at the peak (inference: tokens the KV cache holds)
    checkpointing: bool
    optimizer: str       # one of OPTIMIZERS; "" for inference
    framework: str
    gpu: str
    measure: str         # allocated, active, reserved (PyTorch allocator) or nvml (whole card)
    published: str       # the figure as published
    unit: str            # GB (10^9), GiB, MiB
    url: str
    where: str           # the table, section or output block the figure is in
    prompt: int | None = None   # inference: tokens prefilled at once
    lora_rank: int = 0
    lora_targets: str = ""      # qv: query and value projections; all: every linear layer
    attention: str = "sdpa"     # eager: attention scores materialised (no fused kernel)
    outputs: int = 0            # width of the output layer when not the vocabulary
    loss: str = "standard"      # chunked: the logits' loss computed a chunk at a time
    # Whose code built the model: "hf", as its Hub config and Hugging Face's code build it
    # (transformers, torchtune, gpt-fast alike), or "litgpt": LitGPT's GPT, whose output
    # head is never tied to the embeddings (llm_shapes.litgpt_shape) and whose
    # bitsandbytes plugin quantises every linear layer, the head included.
    implementation: str = "hf"
    unknown: str = ""
    note: str = ""
    outside: str = ""

    @property
    def measured_bytes(self) -> int:
        return round(float(self.published) * UNITS[self.unit])

    @property
    def holds_cuda_context(self) -> bool:
        return self.measure == "nvml"


_LITGPT = "https://github.com/Lightning-AI/litgpt/blob/5895df10"
_LITGPT_TABLE = (f"{_LITGPT}/config_hub/finetune/README.md", "config_hub/finetune/README.md, "
                 "the config table (rows as of commit 5895df10, 2024-04-26)")
_LITGPT_RUN = ("litgpt finetune with the named config at commit 5895df10 (LitGPT's GPT: its "
               "lm_head a Linear of its own beside transformer.wte, never tied): bf16-true "
               "(weights, gradients and torch.optim.AdamW's moments in bf16), no activation "
               "checkpointing "
               "on one device, Alpaca2k batches padded to their longest sample, at most 512 "
               "tokens; the model computes its logits in chunks of 128 positions and the loss is "
               "litgpt's chunked_cross_entropy (lm_head_chunk_size=128); the figure is the "
               "script's 'Memory used' (torch.cuda.max_memory_allocated / 1e9)")
_LITGPT_QLORA_RUN = ("litgpt finetune with the named config at commit 5895df10 (LitGPT's GPT: its "
                     "lm_head a Linear of its own beside transformer.wte, never tied): the base "
                     "model quantised by bitsandbytes (quantize bnb.nf4: Lightning's "
                     "BitsandbytesPrecision with no ignore_modules converts every Linear, lm_head "
                     "included) with bf16 compute, the LoRA adapters and their gradients in "
                     "bf16, and, because bitsandbytes "
                     "quantisation is on, bnb.optim.PagedAdamW (litgpt/finetune/lora.py lines "
                     "180-185: 32-bit moments in CUDA managed memory, which the figure does not "
                     "count), no activation checkpointing on one device, Alpaca2k batches padded "
                     "to their longest sample, at most 512 tokens; the model computes its logits "
                     "in chunks of 128 positions and the loss is litgpt's chunked_cross_entropy "
                     "(lm_head_chunk_size=128); the figure is the script's 'Memory used' "
                     "(torch.cuda.max_memory_allocated / 1e9)")
_LITGPT_GEN = ("https://github.com/Lightning-AI/litgpt/blob/982abcbc/tutorials/quantize.md",
               "tutorials/quantize.md at commit 982abcbc (2023-10-05): 'All the examples below "
               "were run on an A100 40GB GPU'")
_LITGPT_GEN_NOTE = ("generate/base.py at 982abcbc, LitGPT's GPT (lit_gpt/model.py: lm_head a "
                    "Linear of its own beside transformer.wte, so Falcon 7B has 7,217,189,760 "
                    "parameters; --quantize is Lightning's BitsandbytesPrecision with no "
                    "ignore_modules, which converts every Linear, lm_head included): batch 1, "
                    "the default prompt 'Hello, my name is', KV cache sized for prompt + "
                    "max_new_tokens 256; 'Memory used' is torch.cuda.max_memory_allocated / 1e9")
# Pinned to a commit whose text holds the three figures below (read there; the guide's
# page on main may change).
_HF_OPT = ("https://github.com/huggingface/transformers/blob/"
           "008f5c8c29be84d4721dc6d1e0fcd72300580be4/docs/source/en/llm_tutorial_optimization.md")
_HF_OPT_NOTE = ("pipeline(...)(prompt, max_new_tokens=60) with the KV cache on (generate's "
                "default); the guide's own output shows the prompt is 20 tokens; the figure is "
                "torch.cuda.max_memory_allocated / 1024**3")
_TORCHAO = ("https://github.com/pytorch/ao/blob/62c239cf/torchao/_models/llama/README.md",
            "torchao/_models/llama/README.md at commit 62c239cf (2024-09-04), 'KV Cache "
            "Quantization - Memory Efficient Inference', column 'normal peak (GB)'")
_TORCHAO_NOTE = ("benchmarks.sh at 62c239cf: generate.py --cache_size N, no other flags: bf16, "
                 "batch 1, prompt 'Hello, my name is', 200 new tokens, a KV cache preallocated "
                 "for N tokens, no torch.compile; the figure is torch.cuda.max_memory_reserved / "
                 "1e9. model.py allocates an N x N boolean causal mask (N^2 bytes)")
_HF_ANATOMY = ("https://huggingface.co/docs/transformers/v4.27.2/en/perf_train_gpu_one",
               "'Efficient Training on a Single GPU' (v4.27.2; the same runs are in "
               "docs/source/en/model_memory_anatomy.md and the translated perf_train_gpu_one.md)")
_HF_ANATOMY_NOTE = ("transformers Trainer, BertForSequenceClassification (2 labels) on 512 random "
                    "sequences of 512 tokens, a V100 16GB; 'GPU memory occupied' is NVML's used "
                    "memory after trainer.train() (nvmlDeviceGetMemoryInfo, // 1024**2), so it "
                    "holds the CUDA context (the same page measures 1343 MB for it) and the "
                    "caching allocator's reserved pool. BERT of that transformers release "
                    "computes attention eagerly (scores, softmax and dropout mask kept)")
_HF_ANATOMY_UNKNOWN = "the transformers and PyTorch versions are not stated"

MEASUREMENTS: tuple[Measurement, ...] = (
    # --- inference with a KV cache -------------------------------------------------
    Measurement(
        id="inf-llama31-8b-bf16-kv8k", kind="inference", model="llama-3.1-8b", precision="bf16",
        batch=1, sequence=8192, prompt=6, checkpointing=False, optimizer="",
        framework="torchao gpt-fast generate.py", gpu="A100 (memory size not stated)",
        measure="reserved", published="17.86", unit="GB", url=_TORCHAO[0],
        where=_TORCHAO[1] + ", context length 8192", note=_TORCHAO_NOTE,
        unknown="the prompt's token count (one short sentence; taken as 6)"),
    Measurement(
        id="inf-llama31-8b-bf16-kv16k", kind="inference", model="llama-3.1-8b", precision="bf16",
        batch=1, sequence=16384, prompt=6, checkpointing=False, optimizer="",
        framework="torchao gpt-fast generate.py", gpu="A100 (memory size not stated)",
        measure="reserved", published="19.81", unit="GB", url=_TORCHAO[0],
        where=_TORCHAO[1] + ", context length 16384", note=_TORCHAO_NOTE,
        unknown="the prompt's token count (one short sentence; taken as 6)"),
    Measurement(
        id="inf-llama31-8b-bf16-kv32k", kind="inference", model="llama-3.1-8b", precision="bf16",
        batch=1, sequence=32768, prompt=6, checkpointing=False, optimizer="",
        framework="torchao gpt-fast generate.py", gpu="A100 (memory size not stated)",
        measure="reserved", published="23.83", unit="GB", url=_TORCHAO[0],
        where=_TORCHAO[1] + ", context length 32768", note=_TORCHAO_NOTE,
        unknown="the prompt's token count (one short sentence; taken as 6)"),
    Measurement(
        id="inf-llama31-8b-bf16-kv64k", kind="inference", model="llama-3.1-8b", precision="bf16",
        batch=1, sequence=65536, prompt=6, checkpointing=False, optimizer="",
        framework="torchao gpt-fast generate.py", gpu="A100 (memory size not stated)",
        measure="reserved", published="33.5", unit="GB", url=_TORCHAO[0],
        where=_TORCHAO[1] + ", context length 65536", note=_TORCHAO_NOTE,
        unknown="the prompt's token count (one short sentence; taken as 6)",
        outside=("gpt-fast's 65536 x 65536 boolean causal mask, 4.29 GB (12.8 % of the peak), "
                 "grows with the square of the context; the libraries the estimate describes "
                 "(transformers, vLLM) do not allocate it")),
    Measurement(
        id="inf-llama31-8b-bf16-kv128k", kind="inference", model="llama-3.1-8b", precision="bf16",
        batch=1, sequence=131072, prompt=6, checkpointing=False, optimizer="",
        framework="torchao gpt-fast generate.py", gpu="A100 (memory size not stated)",
        measure="reserved", published="59.27", unit="GB", url=_TORCHAO[0],
        where=_TORCHAO[1] + ", context length 131072", note=_TORCHAO_NOTE,
        unknown="the prompt's token count (one short sentence; taken as 6)",
        outside=("gpt-fast's 131072 x 131072 boolean causal mask, 17.18 GB (29 % of the peak), "
                 "grows with the square of the context; the libraries the estimate describes "
                 "(transformers, vLLM) do not allocate it")),
    Measurement(
        id="inf-octocoder-bf16", kind="inference", model="starcoder-15b", precision="bf16",
        batch=1, sequence=80, prompt=20, checkpointing=False, optimizer="",
        framework="transformers pipeline (text-generation)", gpu="not stated (the guide names "
        "'a single 40 GB A100' as enough)", measure="allocated", published="29.0260648727417",
        unit="GiB", url=_HF_OPT, where="'1. Lower Precision', bigcode/octocoder in bfloat16",
        note=_HF_OPT_NOTE, attention="eager",
        unknown="the GPU; the transformers version"),
    Measurement(
        id="inf-octocoder-int8", kind="inference", model="starcoder-15b", precision="int8",
        batch=1, sequence=80, prompt=20, checkpointing=False, optimizer="",
        framework="transformers pipeline, bitsandbytes load_in_8bit (LLM.int8)",
        gpu="not stated (the guide names 'a single 40 GB A100' as enough)", measure="allocated",
        published="15.219234466552734", unit="GiB", url=_HF_OPT,
        where="'1. Lower Precision', load_in_8bit=True", note=_HF_OPT_NOTE, attention="eager",
        unknown="the GPU; the transformers and bitsandbytes versions"),
    Measurement(
        id="inf-octocoder-int4", kind="inference", model="starcoder-15b", precision="int4",
        batch=1, sequence=80, prompt=20, checkpointing=False, optimizer="",
        framework="transformers pipeline, bitsandbytes load_in_4bit",
        gpu="not stated (the guide names 'a single 40 GB A100' as enough)", measure="allocated",
        published="9.543574333190918", unit="GiB", url=_HF_OPT,
        where="'1. Lower Precision', load_in_4bit=True", note=_HF_OPT_NOTE, attention="eager",
        unknown="the GPU; the transformers and bitsandbytes versions (and so the 4-bit type and "
                "compute dtype their defaults chose)"),
    Measurement(
        id="inf-falcon-7b-fp32", kind="inference", model="falcon-7b", precision="fp32",
        batch=1, sequence=262, prompt=6, checkpointing=False, optimizer="",
        implementation="litgpt",
        framework="lit-gpt generate/base.py --precision 32-true", gpu="A100 40GB",
        measure="allocated", published="28.95", unit="GB", url=_LITGPT_GEN[0],
        where=_LITGPT_GEN[1] + ", 'Baseline', --precision 32-true", note=_LITGPT_GEN_NOTE,
        unknown="the prompt's token count (taken as 6)"),
    Measurement(
        id="inf-falcon-7b-bf16", kind="inference", model="falcon-7b", precision="bf16",
        batch=1, sequence=262, prompt=6, checkpointing=False, optimizer="",
        implementation="litgpt",
        framework="lit-gpt generate/base.py --precision bf16-true", gpu="A100 40GB",
        measure="allocated", published="14.50", unit="GB", url=_LITGPT_GEN[0],
        where=_LITGPT_GEN[1] + ", 'Baseline', --precision bf16-true", note=_LITGPT_GEN_NOTE,
        unknown="the prompt's token count (taken as 6)"),
    Measurement(
        id="inf-falcon-7b-nf4", kind="inference", model="falcon-7b", precision="int4",
        batch=1, sequence=262, prompt=6, checkpointing=False, optimizer="",
        implementation="litgpt",
        framework="lit-gpt generate/base.py --quantize bnb.nf4 --precision bf16-true",
        gpu="A100 40GB", measure="allocated", published="5.72", unit="GB", url=_LITGPT_GEN[0],
        where=_LITGPT_GEN[1] + ", 'bnb.nf4'", note=_LITGPT_GEN_NOTE,
        unknown="the prompt's token count (taken as 6)"),
    Measurement(
        id="inf-falcon-7b-int8", kind="inference", model="falcon-7b", precision="int8",
        batch=1, sequence=262, prompt=6, checkpointing=False, optimizer="",
        implementation="litgpt",
        framework="lit-gpt generate/base.py --quantize bnb.int8 --precision 16-true",
        gpu="A100 40GB", measure="allocated", published="8.70", unit="GB", url=_LITGPT_GEN[0],
        where=_LITGPT_GEN[1] + ", 'bnb.int8'", note=_LITGPT_GEN_NOTE,
        unknown="the prompt's token count (taken as 6)"),
    # --- LoRA and QLoRA ----------------------------------------------------------------
    Measurement(
        id="lora-llama2-7b-litgpt", kind="lora", model="llama-2-7b", precision="bf16", batch=2,
        sequence=512, checkpointing=False, optimizer="adamw-bf16", lora_rank=32,
        lora_targets="qv", loss="chunked", implementation="litgpt",
        framework="LitGPT (litgpt finetune lora)", gpu="A10G (1x)",
        measure="allocated", published="19.77", unit="GB", url=_LITGPT_TABLE[0],
        where=_LITGPT_TABLE[1] + ", llama-2-7b/lora.yaml, 1xA10G", note=_LITGPT_RUN,
        unknown="the longest padded batch's length (at most 512)"),
    Measurement(
        id="qlora-llama2-7b-litgpt", kind="qlora", model="llama-2-7b", precision="int4", batch=2,
        sequence=512, checkpointing=False, optimizer="paged-adamw", lora_rank=32,
        lora_targets="qv", loss="chunked", implementation="litgpt",
        framework="LitGPT (litgpt finetune lora, quantize bnb.nf4)",
        gpu="A10G (1x)", measure="allocated", published="13.68", unit="GB",
        url=_LITGPT_TABLE[0], where=_LITGPT_TABLE[1] + ", llama-2-7b/qlora.yaml, 1xA10G",
        note=_LITGPT_QLORA_RUN, unknown="the longest padded batch's length (at most 512)"),
    Measurement(
        id="lora-mistral-7b-litgpt", kind="lora", model="mistral-7b", precision="bf16", batch=2,
        sequence=512, checkpointing=False, optimizer="adamw-bf16", lora_rank=32,
        lora_targets="qv", loss="chunked", implementation="litgpt",
        framework="LitGPT (litgpt finetune lora)", gpu="A10G (1x)",
        measure="allocated", published="20.66", unit="GB", url=_LITGPT_TABLE[0],
        where=_LITGPT_TABLE[1] + ", mistral-7b/lora.yaml, 1xA10G", note=_LITGPT_RUN,
        unknown="the longest padded batch's length (at most 512)"),
    Measurement(
        id="qlora-mistral-7b-litgpt", kind="qlora", model="mistral-7b", precision="int4",
        batch=2, sequence=512, checkpointing=False, optimizer="paged-adamw", lora_rank=32,
        lora_targets="qv", loss="chunked", implementation="litgpt",
        framework="LitGPT (litgpt finetune lora, quantize bnb.nf4)",
        gpu="A10G (1x)", measure="allocated", published="14.29", unit="GB",
        url=_LITGPT_TABLE[0], where=_LITGPT_TABLE[1] + ", mistral-7b/qlora.yaml, 1xA10G",
        note=_LITGPT_QLORA_RUN, unknown="the longest padded batch's length (at most 512)"),
    Measurement(
        id="lora-llama3-8b-litgpt", kind="lora", model="llama-3-8b", precision="bf16", batch=1,
        sequence=512, checkpointing=False, optimizer="adamw-bf16", lora_rank=32,
        lora_targets="qv", loss="chunked", implementation="litgpt",
        framework="LitGPT (litgpt finetune lora)", gpu="A10G (1x)",
        measure="allocated", published="19.73", unit="GB", url=_LITGPT_TABLE[0],
        where=_LITGPT_TABLE[1] + ", llama-3-8b/lora.yaml, 1xA10G", note=_LITGPT_RUN,
        unknown="the longest padded batch's length (at most 512)"),
    Measurement(
        id="qlora-llama3-8b-litgpt", kind="qlora", model="llama-3-8b", precision="int4",
        batch=2, sequence=512, checkpointing=False, optimizer="paged-adamw", lora_rank=32,
        lora_targets="qv", loss="chunked", implementation="litgpt",
        framework="LitGPT (litgpt finetune lora, quantize bnb.nf4)",
        gpu="A10G (1x)", measure="allocated", published="17.41", unit="GB",
        url=_LITGPT_TABLE[0], where=_LITGPT_TABLE[1] + ", llama-3-8b/qlora.yaml, 1xA10G",
        note=_LITGPT_QLORA_RUN, unknown="the longest padded batch's length (at most 512)"),
    Measurement(
        id="lora-falcon-7b-litgpt", kind="lora", model="falcon-7b", precision="bf16", batch=1,
        sequence=512, checkpointing=False, optimizer="adamw-bf16", lora_rank=32,
        lora_targets="qv", loss="chunked", implementation="litgpt",
        framework="LitGPT (litgpt finetune lora)", gpu="A10G (1x)",
        measure="allocated", published="16.69", unit="GB", url=_LITGPT_TABLE[0],
        where=_LITGPT_TABLE[1] + ", falcon-7b/lora.yaml, 1xA10G", note=_LITGPT_RUN,
        unknown="the longest padded batch's length (at most 512)"),
    Measurement(
        id="qlora-falcon-7b-litgpt", kind="qlora", model="falcon-7b", precision="int4",
        batch=1, sequence=512, checkpointing=False, optimizer="paged-adamw", lora_rank=32,
        lora_targets="qv", loss="chunked", implementation="litgpt",
        framework="LitGPT (litgpt finetune lora, quantize bnb.nf4)",
        gpu="A10G (1x)", measure="allocated", published="9.44", unit="GB",
        url=_LITGPT_TABLE[0], where=_LITGPT_TABLE[1] + ", falcon-7b/qlora.yaml, 1xA10G",
        note=_LITGPT_QLORA_RUN, unknown="the longest padded batch's length (at most 512)"),
    Measurement(
        id="lora-llama2-7b-torchtune", kind="lora", model="llama-2-7b", precision="bf16",
        batch=2, sequence=512, checkpointing=True, optimizer="adamw-bf16", lora_rank=8,
        lora_targets="qv", framework="torchtune lora_finetune_single_device",
        gpu="not stated", measure="reserved", published="15.57", unit="GB",
        url=("https://github.com/pytorch/torchtune/blob/0914d5cf/docs/source/tutorials/"
             "qlora_finetune.rst"),
        where=("docs/source/tutorials/qlora_finetune.rst at commit 0914d5cf (2024-04-15), the "
               "table 'Peak memory reserved, training', LoRA; the same figure is "
               "lora_finetune.rst's 'Q and V only', rank 8 row from commit ff594c23 (later the "
               "same day), not at 0914d5cf"),
        note=("config llama2/7B_lora_single_device at 0914d5cf: bf16 weights, torch.optim.AdamW "
              "(moments in bf16 with the parameters), batch 2, alpaca_cleaned truncated to 512 "
              "tokens and padded to each batch's longest, activation checkpointing on, no "
              "compile; the figure is torch.cuda.max_memory_reserved / 1e9"),
        unknown="the GPU; the longest padded batch's length (at most 512)"),
    Measurement(
        id="qlora-llama2-7b-torchtune", kind="qlora", model="llama-2-7b", precision="int4",
        batch=2, sequence=512, checkpointing=True, optimizer="adamw-bf16", lora_rank=8,
        lora_targets="all", framework="torchtune lora_finetune_single_device (NF4 base)",
        gpu="not stated", measure="reserved", published="9.29", unit="GB",
        url=("https://github.com/pytorch/torchtune/blob/0914d5cf/docs/source/tutorials/"
             "qlora_finetune.rst"),
        where=("docs/source/tutorials/qlora_finetune.rst at commit 0914d5cf (2024-04-15), the "
               "table 'Peak memory reserved, training', QLoRA"),
        note=("config llama2/7B_qlora_single_device at 0914d5cf: LoRA rank 8 on q, k, v, output "
              "and the MLP, NF4 base, bf16 compute, torch.optim.AdamW, batch 2, alpaca_cleaned "
              "at most 512 tokens, activation checkpointing on; torch.cuda.max_memory_reserved / "
              "1e9"),
        unknown="the GPU; the longest padded batch's length (at most 512)",
        outside=("the reserved peak is the model's initialisation, not training: the same table "
                 "gives 9.13 GB reserved after init (torchtune of that date loaded the bf16 "
                 "weights before quantising them), and the caching allocator keeps that pool")),
    # --- full fine-tunes ------------------------------------------------------------------
    Measurement(
        id="full-llama32-3b-torchtune-packed", kind="full", model="llama-3.2-3b",
        precision="bf16", batch=2, sequence=4096, checkpointing=False, optimizer="adamw-bf16",
        framework="torchtune full_finetune_single_device", gpu="A100",
        measure="active", published="60.0", unit="GiB",
        url="https://github.com/pytorch/torchtune/blob/1814feb1/README.md",
        where=("README.md at commit 1814feb1 (2024-11-18), 'Optimization flags', row "
               "'+ Packed Dataset' (Peak Memory Active (GiB))"),
        note=("the table's baseline: full_finetune_single_device, Llama 3.2 3B, batch 2, max seq "
              "len 4096, bf16, A100; '+ Packed Dataset' packs the dataset to 4096-token "
              "sequences; compile, chunked cross-entropy, activation checkpointing, the fused "
              "optimizer step and 8-bit AdamW are added only in the rows after it, so this run "
              "is read as having none of them. Its optimizer is not published: the table names "
              "none, and the recipe's config at this commit (llama3_2/3B_full_single_device."
              "yaml) defaults to bitsandbytes' PagedAdamW8bit with optimizer_in_bwd, both of "
              "which the table adds only in later rows; the row assumes torch.optim.AdamW over "
              "bf16 parameters (moments in bf16, 4 bytes a parameter). peak_memory_active is "
              "memory_stats()['active_bytes.all.peak'] / 1024**3"),
        unknown="the A100's memory size; the optimizer, not published (torch.optim.AdamW with "
                "bf16 moments is assumed from the table's order, not read from a config)"),
    Measurement(
        id="full-bert-large-bs4-fp32", kind="full", model="bert-large-uncased", precision="fp32",
        batch=4, sequence=512, checkpointing=False, optimizer="adamw", attention="eager",
        outputs=2, framework="transformers Trainer", gpu="V100 16GB", measure="nvml",
        published="14949", unit="MiB", url=_HF_ANATOMY[0],
        where=_HF_ANATOMY[1] + ": 'Vanilla training' (batch size 4)", note=_HF_ANATOMY_NOTE,
        unknown=_HF_ANATOMY_UNKNOWN),
    Measurement(
        id="full-bert-large-bs1-fp32", kind="full", model="bert-large-uncased", precision="fp32",
        batch=1, sequence=512, checkpointing=False, optimizer="adamw", attention="eager",
        outputs=2, framework="transformers Trainer", gpu="V100 16GB", measure="nvml",
        published="8681", unit="MiB", url=_HF_ANATOMY[0],
        where=_HF_ANATOMY[1] + ": 'Gradient Accumulation' (batch 1, 4 steps accumulated)",
        note=_HF_ANATOMY_NOTE, unknown=_HF_ANATOMY_UNKNOWN),
    Measurement(
        id="full-bert-large-bs1-ckpt-fp32", kind="full", model="bert-large-uncased",
        precision="fp32", batch=1, sequence=512, checkpointing=True, optimizer="adamw",
        attention="eager", outputs=2, framework="transformers Trainer", gpu="V100 16GB",
        measure="nvml", published="6775", unit="MiB", url=_HF_ANATOMY[0],
        where=_HF_ANATOMY[1] + ": 'Gradient Checkpointing' (batch 1, accumulation 4)",
        note=_HF_ANATOMY_NOTE, unknown=_HF_ANATOMY_UNKNOWN),
    Measurement(
        id="full-bert-large-bs4-fp16", kind="full", model="bert-large-uncased", precision="fp16",
        batch=4, sequence=512, checkpointing=False, optimizer="adamw", attention="eager",
        outputs=2, framework="transformers Trainer (fp16=True: PyTorch AMP)", gpu="V100 16GB",
        measure="nvml", published="13939", unit="MiB", url=_HF_ANATOMY[0],
        where=_HF_ANATOMY[1] + ": 'FP16 Training' (batch size 4)", note=_HF_ANATOMY_NOTE,
        unknown=_HF_ANATOMY_UNKNOWN),
    Measurement(
        id="full-bert-large-bs1-ckpt-fp16", kind="full", model="bert-large-uncased",
        precision="fp16", batch=1, sequence=512, checkpointing=True, optimizer="adamw",
        attention="eager", outputs=2, framework="transformers Trainer (fp16=True: PyTorch AMP)",
        gpu="V100 16GB", measure="nvml", published="7275", unit="MiB", url=_HF_ANATOMY[0],
        where=_HF_ANATOMY[1] + ": 'FP16 Training', with gradient checkpointing, batch 1, "
                               "accumulation 4", note=_HF_ANATOMY_NOTE,
        unknown=_HF_ANATOMY_UNKNOWN),
    Measurement(
        id="full-bert-large-bs4-adam8bit", kind="full", model="bert-large-uncased",
        precision="fp32", batch=4, sequence=512, checkpointing=False, optimizer="adamw-8bit",
        attention="eager", outputs=2, framework="transformers Trainer, bitsandbytes Adam8bit",
        gpu="V100 16GB", measure="nvml", published="13085", unit="MiB", url=_HF_ANATOMY[0],
        where=_HF_ANATOMY[1] + ": '8-bit Adam' (batch size 4)", note=_HF_ANATOMY_NOTE,
        unknown=_HF_ANATOMY_UNKNOWN + "; the bitsandbytes version"),
    Measurement(
        id="full-bert-large-bs1-ckpt-fp16-adam8bit", kind="full", model="bert-large-uncased",
        precision="fp16", batch=1, sequence=512, checkpointing=True, optimizer="adamw-8bit",
        attention="eager", outputs=2, framework="transformers Trainer (AMP), bitsandbytes "
        "Adam8bit", gpu="V100 16GB", measure="nvml", published="5363", unit="MiB",
        url=_HF_ANATOMY[0],
        where=_HF_ANATOMY[1] + ": '8-bit Adam' with batch 1, accumulation 4, gradient "
                               "checkpointing and fp16", note=_HF_ANATOMY_NOTE,
        unknown=_HF_ANATOMY_UNKNOWN + "; the bitsandbytes version"),
)

BY_ID: dict[str, Measurement] = {row.id: row for row in MEASUREMENTS}
