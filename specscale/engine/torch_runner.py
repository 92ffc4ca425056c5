"""TorchModelRunner: owns the KV pool, turns a scheduled batch into tensors, runs the model and its head.

The forward pass returns last hidden states of the rows that need the head (its last layer drops the
others after attention; model/transformer.py, DecoderModel), and the head (LM head or PRM score head) runs
on those rows only: the last token of each generating sequence that reaches its end,
and the requested readout positions of prefill-only sequences (`engine.model_runner.head_positions`).
"""

from __future__ import annotations

import torch

from specscale.config import EngineConfig
from specscale.engine.model_runner import ModelRunner, RunnerOutput, head_layout
from specscale.engine.scheduler import ScheduledBatch, ScheduledRow
from specscale.model import cpu_kernels
from specscale.model.attention import AttentionMetadata, padded_prefill_metadata
from specscale.model.kernel_choice import SHORT_PREFILL_MAX_TOKENS, AttentionShape, KernelChoice
from specscale.model.loader import load_model, read_hf_config
from specscale.model.memory import ModelMemory, tensors_bytes, weight_bytes
from specscale.model.transformer import ModelArgs


def kv_bytes_per_block(model, block_size: int, dtype: torch.dtype) -> int:
    args = model.args
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * args.num_layers * block_size * args.num_kv_heads * args.head_dim * element


class TorchModelRunner(ModelRunner):
    """A checkpoint's torch model on its paged KV pool (CPU or CUDA)."""

    def __init__(self, model, num_blocks: int, block_size: int, attention_backend: str = "auto"):
        self.model = model
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device, self.dtype = model.device, model.dtype
        args = model.args
        self.vocab_size = args.vocab_size
        self.head_size = model.output_size
        self.max_position_embeddings = args.max_position_embeddings
        self.kv_bytes_per_block = kv_bytes_per_block(model, block_size, self.dtype)
        shape = (num_blocks, block_size, args.num_kv_heads, args.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=self.dtype, device=self.device), torch.zeros(shape, dtype=self.dtype, device=self.device))
            for _ in range(args.num_layers)
        ]
        self.use_cpu_kernels = self._choose_backend(attention_backend)
        self.use_prefill_kernel = self.use_cpu_kernels and cpu_kernels.has_prefill_kernel(args.head_dim)
        self.use_short_prefill_kernel = self.use_prefill_kernel  # batches of short rows (SHORT_PREFILL_MAX_TOKENS)
        if attention_backend == "auto" and self.use_cpu_kernels and hasattr(model, "kernel_choice"):
            self._measure_attention(model.kernel_choice, args)

    @classmethod
    def from_checkpoint(cls, config: EngineConfig) -> TorchModelRunner:
        """Load config.model (a local Hugging Face folder); the KV pool is config.num_kv_blocks blocks,
        or as many as config.kv_cache_memory_gb holds."""
        model_max = ModelArgs.from_hf_config(read_hf_config(config.model)).max_position_embeddings
        max_model_len = min(config.max_model_len or model_max, model_max)
        model = load_model(config.model, config.dtype, config.device, max_model_len, config.kernels)
        num_blocks = config.num_kv_blocks
        if num_blocks is None:
            per_block = kv_bytes_per_block(model, config.block_size, model.dtype)
            num_blocks = max(int(config.kv_cache_memory_gb * 2**30) // per_block, 1)
        return cls(model, num_blocks, config.block_size, config.attention_backend)

    def _choose_backend(self, backend: str) -> bool:
        if backend not in ("auto", "torch", "cpp"):
            raise ValueError(f"attention_backend must be auto, torch or cpp, got {backend!r}")
        if backend == "torch" or self.device.type != "cpu":
            return False
        if not cpu_kernels.available():
            if backend == "cpp":
                raise RuntimeError("the C++ CPU kernels could not be built on this machine")
            return False
        return True

    def _measure_attention(self, choice: KernelChoice, args) -> None:
        """"auto": the C++ kernels (decode attention with the fused norm / RoPE / activation ops that go with
        it; the prefill kernel on its own) where they measure faster than plain torch here."""
        shape = AttentionShape(args.num_heads, args.num_kv_heads, args.head_dim, str(self.dtype).removeprefix("torch."))
        self.use_cpu_kernels = choice.attention_path(shape, "decode") == "cpp"
        can_prefill = self.use_prefill_kernel and self.use_cpu_kernels
        self.use_prefill_kernel = can_prefill and choice.attention_path(shape, "prefill") == "cpp"
        self.use_short_prefill_kernel = can_prefill and choice.attention_path(shape, "short-prefill") == "cpp"

    def kernels(self) -> dict:
        report = getattr(self.model, "kernel_choice", None)  # a model built without load_model has none
        paths = report.report() if report is not None else {}
        name = {True: "cpp", False: "torch"}
        prefill = name[self.use_prefill_kernel]
        if self.use_short_prefill_kernel != self.use_prefill_kernel:
            prefill = f"{name[self.use_short_prefill_kernel]} to {SHORT_PREFILL_MAX_TOKENS} new tokens a row, {prefill} above"
        return paths | {"attention": name[self.use_cpu_kernels], "prefill_attention": prefill}

    def memory(self) -> ModelMemory:
        rotary = self.model.rotary
        return ModelMemory(
            weight_bytes=weight_bytes(self.model),
            kv_cache_bytes=tensors_bytes(cache for layer in self.kv_caches for cache in layer),
            rope_table_bytes=tensors_bytes([rotary.cos, rotary.sin]),
            device=str(self.device),
        )

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        self._copy_blocks(batch.block_copies)
        input_ids, positions, meta = self._prepare(batch)
        head_index, head_rows = self._head_rows(batch)
        every_row = len(head_index) == len(input_ids)  # distinct, in-batch rows: all of them, nothing to drop
        index = None if every_row else torch.tensor(head_index, dtype=torch.long, device=self.device)
        hidden = self.model(input_ids, positions, self.kv_caches, meta, index)  # [R, hidden], R head rows
        return RunnerOutput(self.model.compute_head(hidden), head_rows)  # [R, head_size]

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], dtype=torch.long, device=self.device)
        dst = torch.tensor([d for _, d in copies], dtype=torch.long, device=self.device)
        for key_cache, value_cache in self.kv_caches:
            key_cache.index_copy_(0, dst, key_cache.index_select(0, src))
            value_cache.index_copy_(0, dst, value_cache.index_select(0, src))

    def _prepare(self, batch: ScheduledBatch):
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        for row in batch.rows:
            seq, table = row.seq, row.seq.block_table
            ids += seq.token_ids[row.start : row.end]
            span = range(row.start, row.end)
            pos += span
            slots += [table[p // bs] * bs + p % bs for p in span]
        device = self.device
        prefill_kernel = self._prefill_kernel_for(batch.prefill_rows)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            num_decode_tokens=len(batch.decode_rows),
            **self._decode_metadata(batch.decode_rows),
            **self._prefill_metadata(batch.prefill_rows, prefill_kernel),
            use_cpu_kernels=self.use_cpu_kernels,
            use_prefill_kernel=prefill_kernel,
        )
        return torch.tensor(ids, dtype=torch.long, device=device), torch.tensor(pos, dtype=torch.long, device=device), meta

    def _block_tables(self, rows: list[ScheduledRow], dtype: torch.dtype) -> torch.Tensor:
        width = max(len(row.seq.block_table) for row in rows)
        padded = [row.seq.block_table + [0] * (width - len(row.seq.block_table)) for row in rows]
        return torch.tensor(padded, dtype=dtype, device=self.device)

    def _decode_metadata(self, rows: list[ScheduledRow]) -> dict:
        if not rows:
            return {"decode_block_tables": None, "decode_context_lens": None}
        dtype = torch.int32 if self.use_cpu_kernels else torch.long
        lens = torch.tensor([row.end for row in rows], dtype=dtype, device=self.device)
        return {"decode_block_tables": self._block_tables(rows, dtype), "decode_context_lens": lens}

    def _prefill_kernel_for(self, rows: list[ScheduledRow]) -> bool:
        """Whether this batch's prefill rows run the C++ kernel: the path measured for short prefills when no
        row brings more than SHORT_PREFILL_MAX_TOKENS new tokens, else the one measured for long ones."""
        short = bool(rows) and max(row.num_tokens for row in rows) <= SHORT_PREFILL_MAX_TOKENS
        return self.use_short_prefill_kernel if short else self.use_prefill_kernel

    def _prefill_metadata(self, rows: list[ScheduledRow], use_kernel: bool) -> dict:
        if not rows:
            return {"prefill_block_tables": None, "prefill_mask": None, "prefill_query_index": None, "prefill_query_len": 0}
        if use_kernel:  # the kernel masks causally itself: no padded grid, no mask
            return {
                "prefill_block_tables": self._block_tables(rows, torch.int32),
                "prefill_mask": None,
                "prefill_query_index": None,
                "prefill_query_len": 0,
                "prefill_starts": torch.tensor([row.start for row in rows], device=self.device),
                "prefill_counts": torch.tensor([row.num_tokens for row in rows], device=self.device),
            }
        tables = self._block_tables(rows, torch.long)  # [Bp, nb]
        starts = torch.tensor([row.start for row in rows], device=self.device)  # [Bp]
        counts = torch.tensor([row.num_tokens for row in rows], device=self.device)  # [Bp]
        return padded_prefill_metadata(tables, starts, counts, self.block_size)

    def _head_rows(self, batch: ScheduledBatch) -> tuple[list[int], list[tuple[int, int]]]:
        """(flat token index of every head position, (offset, count) per row)."""
        positions, head_rows = head_layout(batch)
        head_index, first = [], 0  # first: flat index of the row's first token
        for row, wanted in zip(batch.rows, positions, strict=True):
            head_index += [first + p - row.start for p in wanted]
            first += row.num_tokens
        return head_index, head_rows
