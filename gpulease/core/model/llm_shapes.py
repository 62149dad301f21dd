"""The shapes of known language models: what a memory estimate needs to know of one.

A researcher describing the work names a model from this table (or gives a bare
parameter count, `shape_for_parameters`). Every entry's dimensions are those of
the model's `config.json` on the Hugging Face Hub (the URL in `source`), as
LitGPT's `litgpt/config.py` also records them; `parameters` is the sum of the
weight shapes those dimensions give (embeddings, attention, MLP, norms, the
output head unless it is tied to the embeddings), which is the figure each
model card states (Llama 2 7B 6,738,415,616; Llama 3.1 8B 8,030,261,248;
Mistral 7B 7,241,732,096; Falcon 7B 6.92 B; BERT large 335,141,888, which its
card rounds to 336M). StarCoder/OctoCoder's 15.5 B is its model card's figure.

These are the models as Hugging Face's code builds them (transformers; torchtune
and gpt-fast build the same). LitGPT builds some differently: its GPT
(lit_gpt/model.py at 982abcbc, litgpt/model.py at 5895df10) has an output head
`lm_head` of its own beside the embedding table `transformer.wte`, and its
fine-tuning scripts refuse `tie_embeddings`, so a model whose Hub checkpoint ties
the two is one vocabulary x width matrix larger there (`litgpt_shape`): Falcon 7B
has 7,217,189,760 parameters in LitGPT, 6,921,720,704 on the Hub.

Fields:

- `layers`, `hidden`: transformer blocks and the model (residual) width.
- `heads`, `kv_heads`, `head_dim`: query heads, key/value heads (fewer under
  grouped- or multi-query attention), width of one head. The KV cache holds
  `kv_heads * head_dim` values per token per layer for keys and as many for values.
- `ffn`: the MLP's inner width; `gated_mlp` when the MLP has two input
  projections (SwiGLU: gate and up), so its hidden activations are `2 * ffn`
  wide per token.
- `vocab`: rows of the embedding table; `tied` when the output head shares them.
- `outputs`: the width of the output layer (the vocabulary for a causal LM).

Pure data and pure functions.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

HF = "https://huggingface.co"


@dataclass(frozen=True)
class ModelShape:
    key: str
    name: str
    parameters: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    gated_mlp: bool
    vocab: int
    tied: bool
    source: str
    outputs: int = 0  # 0: the vocabulary
    assumed: bool = False  # True for a shape made up from a bare parameter count

    @property
    def output_width(self) -> int:
        return self.outputs or self.vocab

    @property
    def mlp_width(self) -> int:
        """Width of the MLP's hidden activations per token (gate and up for a gated MLP)."""
        return self.ffn * (2 if self.gated_mlp else 1)

    @property
    def embedding_parameters(self) -> int:
        """Parameters of the embedding table and, unless tied, the output head.

        Quantisation (bitsandbytes' 8- and 4-bit loaders, torchao's NF4) leaves these
        in 16 bits: they are not the linear layers it replaces.
        """
        return self.vocab * self.hidden * (1 if self.tied else 2)


def _llama(key: str, name: str, repo: str, *, layers: int, hidden: int, heads: int,
           kv_heads: int, head_dim: int, ffn: int, vocab: int, tied: bool,
           qkv_bias: bool = False) -> ModelShape:
    """A Llama-architecture entry (RMSNorm, rotary, SwiGLU, no biases but Qwen's
    query/key/value biases), its parameter count the sum of its weight shapes."""
    per_layer = (hidden * heads * head_dim            # query
                 + 2 * hidden * kv_heads * head_dim   # key, value
                 + heads * head_dim * hidden          # attention output
                 + 3 * hidden * ffn                   # gate, up, down
                 + 2 * hidden)                        # two RMSNorms
    if qkv_bias:
        per_layer += heads * head_dim + 2 * kv_heads * head_dim
    parameters = vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden
    return ModelShape(key=key, name=name, parameters=parameters, layers=layers, hidden=hidden,
                      heads=heads, kv_heads=kv_heads, head_dim=head_dim, ffn=ffn,
                      gated_mlp=True, vocab=vocab, tied=tied,
                      source=f"{HF}/{repo}/blob/main/config.json")


_MODELS: tuple[ModelShape, ...] = (
    _llama("llama-3.2-1b", "Llama 3.2 1B", "meta-llama/Llama-3.2-1B", layers=16, hidden=2048,
           heads=32, kv_heads=8, head_dim=64, ffn=8192, vocab=128256, tied=True),
    _llama("llama-3.2-3b", "Llama 3.2 3B", "meta-llama/Llama-3.2-3B", layers=28, hidden=3072,
           heads=24, kv_heads=8, head_dim=128, ffn=8192, vocab=128256, tied=True),
    _llama("llama-2-7b", "Llama 2 7B", "meta-llama/Llama-2-7b-hf", layers=32, hidden=4096,
           heads=32, kv_heads=32, head_dim=128, ffn=11008, vocab=32000, tied=False),
    _llama("llama-2-13b", "Llama 2 13B", "meta-llama/Llama-2-13b-hf", layers=40, hidden=5120,
           heads=40, kv_heads=40, head_dim=128, ffn=13824, vocab=32000, tied=False),
    _llama("llama-3-8b", "Llama 3 8B", "meta-llama/Meta-Llama-3-8B", layers=32, hidden=4096,
           heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256, tied=False),
    _llama("llama-3.1-8b", "Llama 3.1 8B", "meta-llama/Llama-3.1-8B", layers=32, hidden=4096,
           heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256, tied=False),
    _llama("llama-3.1-70b", "Llama 3.1 70B", "meta-llama/Llama-3.1-70B", layers=80,
           hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672, vocab=128256,
           tied=False),
    _llama("mistral-7b", "Mistral 7B v0.1", "mistralai/Mistral-7B-v0.1", layers=32,
           hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=32000, tied=False),
    _llama("phi-3-mini", "Phi-3 mini (4k)", "microsoft/Phi-3-mini-4k-instruct", layers=32,
           hidden=3072, heads=32, kv_heads=32, head_dim=96, ffn=8192, vocab=32064, tied=False),
    _llama("qwen2.5-7b", "Qwen2.5 7B", "Qwen/Qwen2.5-7B", layers=28, hidden=3584, heads=28,
           kv_heads=4, head_dim=128, ffn=18944, vocab=152064, tied=False, qkv_bias=True),
    _llama("qwen2.5-14b", "Qwen2.5 14B", "Qwen/Qwen2.5-14B", layers=48, hidden=5120,
           heads=40, kv_heads=8, head_dim=128, ffn=13824, vocab=152064, tied=False,
           qkv_bias=True),
    _llama("qwen2.5-32b", "Qwen2.5 32B", "Qwen/Qwen2.5-32B", layers=64, hidden=5120,
           heads=40, kv_heads=8, head_dim=128, ffn=27648, vocab=152064, tied=False,
           qkv_bias=True),
    # Falcon: parallel attention and MLP, multi-query attention (one KV head), a
    # GELU MLP four times as wide, the output head tied to the embeddings.
    ModelShape(key="falcon-7b", name="Falcon 7B", parameters=6_921_720_704, layers=32,
               hidden=4544, heads=71, kv_heads=1, head_dim=64, ffn=18176, gated_mlp=False,
               vocab=65024, tied=True, source=f"{HF}/tiiuae/falcon-7b/blob/main/config.json"),
    # StarCoder's architecture (GPTBigCode): multi-query attention, a GELU MLP,
    # learned positions; 15.5 B parameters as its model card says.
    ModelShape(key="starcoder-15b", name="StarCoder / OctoCoder 15.5B",
               parameters=15_500_000_000, layers=40, hidden=6144, heads=48, kv_heads=1,
               head_dim=128, ffn=24576, gated_mlp=False, vocab=49152, tied=True,
               source=f"{HF}/bigcode/octocoder/blob/main/config.json"),
    ModelShape(key="bert-large-uncased", name="BERT large (uncased)", parameters=335_141_888,
               layers=24, hidden=1024, heads=16, kv_heads=16, head_dim=64, ffn=4096,
               gated_mlp=False, vocab=30522, tied=True,
               source=f"{HF}/google-bert/bert-large-uncased/blob/main/config.json"),
)

MODELS: dict[str, ModelShape] = {shape.key: shape for shape in _MODELS}


def litgpt_shape(shape: ModelShape) -> ModelShape:
    """`shape` as LitGPT builds it: the output head never tied to the embeddings (module
    docstring); a model untied already is the same."""
    if not shape.tied:
        return shape
    return replace(shape, parameters=shape.parameters + shape.vocab * shape.hidden, tied=False)

_ALIASES = {
    "octocoder": "starcoder-15b",
    "starcoder": "starcoder-15b",
    "meta-llama-3-8b": "llama-3-8b",
    "meta-llama-3.1-8b": "llama-3.1-8b",
    "mistral-7b-v0.1": "mistral-7b",
    "bert-large": "bert-large-uncased",
}


def known_model(name: str) -> ModelShape | None:
    """The entry for a model name (its key, case and a Hub organisation ignored)."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    key = re.sub(r"-hf$", "", key)
    key = _ALIASES.get(key, key)
    return MODELS.get(key)


# A bare parameter count gets a Llama-like shape: width 128 times the depth
# (Llama 2 7B and 13B: 4096/32, 5120/40), 128-wide heads with as many KV heads
# as query heads (no grouped-query saving is assumed), an MLP 8/3 as wide as the
# model, and Llama 3's 128,256-token vocabulary (the output logits of training
# grow with it: the larger common vocabulary is the safer guess). Parameters =
# 12·L·h² then gives h = (128·P/12)^(1/3).
_ASSUMED_ASPECT = 128
_ASSUMED_VOCAB = 128256


def shape_for_parameters(parameters: int) -> ModelShape:
    """A made-up Llama-like shape for a model known only by its parameter count."""
    if parameters <= 0:
        raise ValueError("a parameter count is a positive integer")
    hidden = (_ASSUMED_ASPECT * parameters / 12) ** (1 / 3)
    hidden = max(128, int(round(hidden / 128)) * 128)
    layers = max(1, round(parameters / (12 * hidden * hidden)))
    heads = hidden // 128
    ffn = int(math.ceil(hidden * 8 / 3 / 256) * 256)
    return ModelShape(key="", name=f"{parameters:,} parameters", parameters=parameters,
                      layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
                      head_dim=128, ffn=ffn, gated_mlp=True, vocab=_ASSUMED_VOCAB,
                      tied=False, source="assumed Llama-like shape", assumed=True)
