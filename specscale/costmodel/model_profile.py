"""ModelProfile: what a model costs, from nothing but its Hugging Face `config.json`.

Counted for a Qwen2 / Llama decoder (GQA attention with optional q/k/v bias, SwiGLU MLP, RMSNorm):

    per layer   q, o: hidden x heads*head_dim each; k, v: hidden x kv_heads*head_dim each (+ bias on
                Qwen2); gate, up, down: 3 x hidden x intermediate; two RMSNorm weight vectors
    body        layers x per layer + the final norm (every token runs it)
    embedding   vocab x hidden (gathered, never multiplied)
    head        LM head: vocab x hidden (shared with the embedding when tied: counted once in memory,
                still read and multiplied per head row); PRM score head (`*ForProcessRewardModel`):
                Linear(hidden, hidden) + ReLU + Linear(hidden, 2)

FLOPs: 2 per weight per token for the body, 2 per head weight per head row, and attention
4 x layers x heads x head_dim per (query, key) pair (q.k and the weighted sum of v). KV bytes per
token: 2 (K and V) x layers x kv_heads x head_dim x dtype bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specscale.model.transformer import ModelArgs

MODELS_DIR = Path(__file__).parent / "data" / "models"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelProfile:
    """One model's shape; `head` is "lm" (next-token logits) or "score" (a PRM's 2-class head)."""

    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    attention_bias: bool
    head: str
    max_position_embeddings: int
    dtype_bytes: int = 2

    @classmethod
    def from_hf_config(cls, config: dict, name: str, dtype: str | None = None) -> ModelProfile:
        """The shape the engine's loader reads (`ModelArgs`); dtype None takes config.json's `torch_dtype`
        (bfloat16 when it names none)."""
        args = ModelArgs.from_hf_config(config)
        dtype = dtype or config.get("torch_dtype") or config.get("dtype") or "bfloat16"
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"{name}: unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}")
        return cls(
            name=name, architecture=args.architecture, num_layers=args.num_layers, hidden_size=args.hidden_size,
            intermediate_size=args.intermediate_size, num_heads=args.num_heads, num_kv_heads=args.num_kv_heads,
            head_dim=args.head_dim, vocab_size=args.vocab_size, tied_embeddings=args.tie_word_embeddings,
            attention_bias=args.attention_bias,
            head="score" if args.architecture.endswith("ForProcessRewardModel") else "lm",
            max_position_embeddings=args.max_position_embeddings, dtype_bytes=DTYPE_BYTES[dtype],
        )

    @classmethod
    def load(cls, name_or_path: str, dtype: str | None = None) -> ModelProfile:
        """A bundled shape by name (`bundled_models()`), or a model folder / config.json path."""
        path = Path(name_or_path)
        if (MODELS_DIR / name_or_path / "config.json").is_file():
            path = MODELS_DIR / name_or_path
        config_file = path / "config.json" if path.is_dir() else path
        if not config_file.is_file():
            raise FileNotFoundError(f"no model shape {name_or_path!r}: neither a bundled one "
                                    f"({', '.join(bundled_models())}) nor a config.json path")
        name = path.name if path.is_dir() else path.parent.name
        return cls.from_hf_config(json.loads(config_file.read_text()), name, dtype)

    # ---- parameters ------------------------------------------------------------------------------
    @property
    def layer_params(self) -> int:
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = 2 * h * q + 2 * h * kv + ((q + 2 * kv) if self.attention_bias else 0)
        return attention + 3 * h * self.intermediate_size + 2 * h

    @property
    def body_params(self) -> int:
        return self.num_layers * self.layer_params + self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def head_params(self) -> int:
        """Weights the head multiplies per head row."""
        h = self.hidden_size
        return self.vocab_size * h if self.head == "lm" else h * h + h + 2 * h + 2

    @property
    def total_params(self) -> int:
        shared = self.head == "lm" and self.tied_embeddings
        return self.body_params + self.embedding_params + (0 if shared else self.head_params)

    # ---- what an iteration moves and computes -------------------------------------------------------
    @property
    def weight_bytes(self) -> int:
        return self.total_params * self.dtype_bytes

    @property
    def body_weight_bytes(self) -> int:
        return self.body_params * self.dtype_bytes

    @property
    def head_weight_bytes(self) -> int:
        return self.head_params * self.dtype_bytes

    @property
    def body_flops_per_token(self) -> int:
        return 2 * self.body_params

    @property
    def head_flops_per_row(self) -> int:
        return 2 * self.head_params

    @property
    def attention_flops_per_key(self) -> int:
        """FLOPs of one query token against one key (every layer)."""
        return 4 * self.num_layers * self.num_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_block(self, block_size: int) -> int:
        return block_size * self.kv_bytes_per_token


def bundled_models() -> list[str]:
    """Names of the config shapes shipped with SpecScale."""
    return sorted(p.name for p in MODELS_DIR.iterdir() if (p / "config.json").is_file())
