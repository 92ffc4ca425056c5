"""Frozen configuration dataclasses shared by the engine, the verifier and the search runtime."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    """How one engine (a model, its KV pool and its scheduler) is set up.

    model: a local Hugging Face folder (config.json, *.safetensors, tokenizer files).
    dtype: "float32", "bfloat16" or "float16"; "auto" takes the checkpoint's dtype on CUDA and
        float32 on CPU for generators.
    block_size: tokens per KV block.
    num_kv_blocks: KV pool size in blocks; None sizes it from kv_cache_memory_gb.
    max_num_batched_tokens: token budget of one iteration (decode rows + prefill chunks).
    max_num_seqs: most sequences in one iteration.
    max_model_len: context cap per sequence; None takes the model's max_position_embeddings.
    enable_prefix_caching: reuse full KV blocks whose content hash matches (automatic prefix caching).
    attention_backend: "auto" (C++ decode kernel on CPU when it builds), "torch" or "cpp".
    seed: seeds the engine's generator, used by sequences without a seed of their own.
    """

    model: str
    dtype: str = "auto"
    device: str = "cpu"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_gb: float = 1.0
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    attention_backend: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.max_num_batched_tokens <= 0:
            raise ValueError(f"max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}")
        if self.max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs must be positive, got {self.max_num_seqs}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
