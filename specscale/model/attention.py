"""Paged attention over a block-structured KV cache, in plain torch, with a C++ decode kernel on CPU.

KV cache of one layer: key_cache, value_cache of shape [num_blocks, block_size, KVH, D]. A sequence's
block table lists its blocks in position order, so token position p lives in slot
block_table[p // block_size] * block_size + p % block_size.

The flat batch holds the decode tokens first (one per decode sequence), then the prefill tokens of
the prefill sequences in order. Decode rows attend to their whole context; a prefill row of a
sequence attends causally to the cached context plus the new tokens up to its own position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specscale.model import cpu_kernels
from specscale.model.prefill_padding import grid_len, pad_block_tables, pads_sdpa

# SDPA's enable_gqa (torch >= 2.5) lets KV heads serve their query heads without copies
SDPA_HAS_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


@dataclass(frozen=True)
class AttentionMetadata:
    """Per-iteration attention inputs, built once by the model runner and shared by all layers.

    slot_mapping: [T] flat cache slot of every new token (decode tokens first, then prefill tokens).
    num_decode_tokens: Td, the number of decode sequences (one token each).
    decode_block_tables: [Td, max_blocks] int32, padded with 0 (never read past context_lens).
    decode_context_lens: [Td] int32, tokens each decode row attends to (including itself).
    prefill_block_tables: [Bp, max_blocks] (int32 for the prefill kernel, int64 for the torch path).
    prefill_mask: [Bp, 1, Lq, S] bool; True where query row i may attend key position j (torch path); None
        when every prefill sequence starts at position 0 (causal SDPA).
    prefill_query_index: [Tp] index of each flat prefill token in the padded [Bp * Lq] query grid (torch path);
        None when every prefill sequence has Lq new tokens (the flat batch is the grid).
    prefill_starts, prefill_counts: [Bp] int64 first position and number of new tokens per prefill sequence
        (prefill kernel).
    use_cpu_kernels: run the C++ CPU kernels (decode attention, residual add + RMSNorm, RoPE + KV write,
        silu * up) instead of plain torch (gather + SDPA for decode rows).
    use_prefill_kernel: prefill rows through the C++ paged prefill kernel instead of a padded SDPA.
    """

    slot_mapping: torch.Tensor
    num_decode_tokens: int
    decode_block_tables: torch.Tensor | None
    decode_context_lens: torch.Tensor | None
    prefill_block_tables: torch.Tensor | None
    prefill_mask: torch.Tensor | None
    prefill_query_index: torch.Tensor | None
    prefill_query_len: int
    prefill_starts: torch.Tensor | None = None
    prefill_counts: torch.Tensor | None = None
    use_cpu_kernels: bool = False
    use_prefill_kernel: bool = False


def write_kv(key_cache, value_cache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter the new tokens' keys and values ([T, KVH, D]) into their cache slots."""
    num_blocks, block_size, kv_heads, head_dim = key_cache.shape
    key_cache.view(num_blocks * block_size, kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    value_cache.view(num_blocks * block_size, kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def gather_context(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[num_blocks, bs, KVH, D] gathered by [B, nb] block tables -> [B, KVH, nb*bs, D]."""
    b, nb = block_tables.shape
    _, bs, kv_heads, head_dim = cache.shape
    return cache[block_tables].view(b, nb * bs, kv_heads, head_dim).transpose(1, 2)


def grouped_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float):
    """GQA without repeating K/V: q [B, Lq, H, D], k/v [B, KVH, S, D], mask [B, 1, Lq, S] -> [B, Lq, H, D].

    The g = H / KVH query heads sharing one KV head are folded into the query-length axis.
    """
    b, lq, h, d = q.shape
    kv_heads = k.shape[1]
    g = h // kv_heads
    q = q.view(b, lq, kv_heads, g, d).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, g * lq, d)
    if g > 1:
        mask = mask.unsqueeze(2).expand(b, 1, g, lq, mask.shape[-1]).reshape(b, 1, g * lq, mask.shape[-1])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # [B, KVH, g*Lq, D]
    return out.view(b, kv_heads, g, lq, d).permute(0, 3, 1, 2, 4).reshape(b, lq, h, d)


def decode_attention(q, key_cache, value_cache, block_tables, context_lens, scale, use_kernel: bool):
    """q [Bd, H, D] (one query per sequence) -> [Bd, H, D]."""
    if use_kernel:
        return cpu_kernels.paged_decode_attention(q, key_cache, value_cache, block_tables, context_lens, scale)
    if pads_sdpa(block_tables.device):  # few key lengths: few cached SDPA kernels (model/prefill_padding.py)
        block_tables = pad_block_tables(block_tables, key_cache.shape[1])  # extra keys: masked by context_lens
    k = gather_context(key_cache, block_tables)  # [Bd, KVH, S, D]
    v = gather_context(value_cache, block_tables)
    positions = torch.arange(k.shape[2], device=q.device)
    mask = (positions[None, :] < context_lens[:, None])[:, None, None, :]  # [Bd, 1, 1, S]
    return grouped_sdpa(q.unsqueeze(1), k, v, mask, scale).squeeze(1)


def padded_prefill_metadata(tables: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor,
                            block_size: int) -> dict:
    """The torch path's prefill fields of `AttentionMetadata`: block tables [Bp, nb] (int64), first positions
    and new-token counts [Bp] -> the causal mask over cached + new keys (None when no sequence has cached
    context: then SDPA's own causal mask is exact) and each real token's grid index (None without padding). On CPU
    the grid and the keys are padded to a few lengths (model/prefill_padding.py), so the returned tables may be
    wider than the given ones."""
    query_len = int(counts.max())
    if pads_sdpa(tables.device):  # few grid / key lengths: few cached SDPA kernels (model/prefill_padding.py)
        query_len = grid_len(query_len)
        tables = pad_block_tables(tables, block_size)  # extra keys: masked out, or causally unseen
    q = torch.arange(query_len, device=tables.device)  # [Lq]
    padding = q[None, :] >= counts[:, None]  # [Bp, Lq]
    valid = None if not bool(padding.any()) else (~padding).flatten().nonzero().squeeze(1)  # flat [Bp*Lq] index of each real token
    fields = {"prefill_block_tables": tables, "prefill_mask": None, "prefill_query_index": valid,
              "prefill_query_len": query_len}
    if not bool(starts.any()):
        # every sequence starts at position 0: real query row i attends keys 0..i, which is SDPA's causal mask
        # (top-left aligned when S > Lq); padded rows read finite cache slots and are dropped
        return fields
    keys = torch.arange(tables.shape[1] * block_size, device=tables.device)  # [S]
    query_pos = starts[:, None] + q[None, :]  # [Bp, Lq]
    mask = keys[None, None, :] <= query_pos[:, :, None]  # causal over cached + new: [Bp, Lq, S]
    mask = torch.where(padding[:, :, None], keys[None, None, :] == 0, mask)  # padded rows attend key 0 only
    return fields | {"prefill_mask": mask[:, None]}


def prefill_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float):
    """q [B, Lq, H, D], k/v [B, KVH, S, D], mask [B, 1, Lq, S] or None (causal from position 0) -> [B, Lq, H, D].

    Heads kept apart (not folded into the query axis as decode does), so that SDPA takes its flash kernel (its
    bf16 GEMMs run on AMX where the CPU has it); it reads strided operands and its output, transposed back, is
    contiguous.
    """
    q = q.transpose(1, 2)  # [B, H, Lq, D]
    if not SDPA_HAS_GQA and k.shape[1] != q.shape[1]:  # torch < 2.5: repeat each KV head for its query heads
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    gqa = {"enable_gqa": True} if SDPA_HAS_GQA else {}
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, **gqa)
    return out.transpose(1, 2)  # [B, Lq, H, D]


def prefill_attention(q, key_cache, value_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q [Tp, H, D] flat prefill tokens -> [Tp, H, D], through a padded [Bp, Lq] query grid (or the kernel)."""
    if meta.use_prefill_kernel:
        return cpu_kernels.paged_prefill_attention(q, key_cache, value_cache, meta.prefill_block_tables,
                                                   meta.prefill_starts, meta.prefill_counts, scale)
    bp = meta.prefill_block_tables.shape[0]
    tp, h, d = q.shape
    grid = q
    if meta.prefill_query_index is not None:  # sequences of unequal length: pad each to the longest
        grid = q.new_zeros(bp * meta.prefill_query_len, h, d)
        grid.index_copy_(0, meta.prefill_query_index, q)
    k = gather_context(key_cache, meta.prefill_block_tables)  # [Bp, KVH, S, D]
    v = gather_context(value_cache, meta.prefill_block_tables)
    out = prefill_sdpa(grid.view(bp, meta.prefill_query_len, h, d), k, v, meta.prefill_mask, scale)
    out = out.reshape(bp * meta.prefill_query_len, h, d)
    return out if meta.prefill_query_index is None else out.index_select(0, meta.prefill_query_index)


def paged_attention(q, key_cache, value_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q [T, H, D] for the flat batch (decode tokens first) -> attention output [T, H, D]."""
    td = meta.num_decode_tokens
    parts = []
    if td:
        parts.append(
            decode_attention(
                q[:td], key_cache, value_cache, meta.decode_block_tables, meta.decode_context_lens,
                scale, meta.use_cpu_kernels,
            )
        )
    if q.shape[0] > td:
        parts.append(prefill_attention(q[td:], key_cache, value_cache, meta, scale))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
