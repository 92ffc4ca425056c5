"""Paged attention (decode kernel, gather+SDPA decode, padded prefill) equals dense causal attention."""

import math

import pytest
import torch

from specscale.engine.scheduler import ScheduledBatch, ScheduledRow
from specscale.engine.sequence import Sequence
from specscale.engine.torch_runner import TorchModelRunner
from specscale.model import cpu_kernels
from specscale.model.attention import paged_attention, write_kv

H, KVH, BS, NB = 8, 2, 4, 64


def dense_attention(q, k, v, start, D):
    """q [n, H, D] at positions start..start+n-1; k, v [ctx, KVH, D] for positions 0..ctx-1."""
    g = H // KVH
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)  # [ctx, H, D]
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
    qpos = torch.arange(q.shape[0])[:, None] + start
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > qpos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def tiny_model(head_dim):
    """What TorchModelRunner reads off a model to size its KV pool."""

    class Model:
        output_size = 2
        device, dtype = torch.device("cpu"), torch.float32

        class args:
            num_kv_heads, num_layers, vocab_size, max_position_embeddings = KVH, 1, 2, 64

    Model.args.head_dim = head_dim
    return Model()


# (cached tokens, new tokens) per sequence: decode rows and prefill chunks with cached prefixes
MIXED = [(9, 1), (0, 1), (30, 1), (0, 7), (5, 11), (13, 3)]
# the torch prefill path's shortcuts: every prefill from position 0 (SDPA's causal mask, no explicit mask), of
# unequal lengths (a padded query grid) or equal ones (the flat batch is the grid)
FRESH_UNEQUAL = [(4, 1), (0, 7), (0, 11), (0, 3)]
FRESH_EQUAL = [(0, 8), (0, 8), (0, 8)]


# D = 16, 64, 128 take the AVX-512 kernel (one instantiation per D / 16), D = 24 the portable one
@pytest.mark.parametrize("backend,D,shapes", [("torch", 16, MIXED), ("torch", 16, FRESH_UNEQUAL),
                                              ("torch", 64, FRESH_EQUAL), ("cpp", 16, MIXED), ("cpp", 24, MIXED),
                                              ("cpp", 64, MIXED), ("cpp", 128, MIXED), ("cpp", 64, FRESH_UNEQUAL)])
def test_paged_attention_equals_dense(backend, D, shapes):
    assert backend == "torch" or cpu_kernels.available(), "the C++ decode kernel failed to build"
    torch.manual_seed(0)
    runner = TorchModelRunner(tiny_model(D), NB, BS, attention_backend=backend)
    key_cache, value_cache = runner.kv_caches[0]
    free = list(torch.randperm(NB).tolist())
    rows, ks, vs = [], [], []
    for i, (cached, new) in enumerate(shapes):
        total = cached + new
        seq = Sequence(seq_id=i, token_ids=[0] * total, params=None, arrival=i)
        seq.block_table = [free.pop() for _ in range(-(-total // BS))]
        k, v = torch.randn(total, KVH, D), torch.randn(total, KVH, D)
        slots = torch.tensor([seq.block_table[p // BS] * BS + p % BS for p in range(cached)], dtype=torch.long)
        write_kv(key_cache, value_cache, k[:cached], v[:cached], slots)
        rows.append(ScheduledRow(seq, cached, new))
        ks.append(k)
        vs.append(v)
    batch = ScheduledBatch(decode_rows=[r for r in rows if r.num_tokens == 1],
                           prefill_rows=[r for r in rows if r.num_tokens > 1])
    order = [rows.index(r) for r in batch.rows]
    _, _, meta = runner._prepare(batch)
    q_new = {i: torch.randn(shapes[i][1], H, D) for i in order}
    q = torch.cat([q_new[i] for i in order])
    k_new = torch.cat([ks[i][shapes[i][0]:] for i in order])
    v_new = torch.cat([vs[i][shapes[i][0]:] for i in order])
    write_kv(key_cache, value_cache, k_new, v_new, meta.slot_mapping)
    out = paged_attention(q, key_cache, value_cache, meta, 1 / math.sqrt(D))
    expected = torch.cat([dense_attention(q_new[i], ks[i], vs[i], shapes[i][0], D) for i in order])
    assert (out - expected).abs().max().item() < 1e-5
