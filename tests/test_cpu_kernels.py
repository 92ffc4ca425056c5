"""The fused C++ CPU kernels compute what the plain-torch path of model/transformer.py computes."""

import pytest
import torch
import torch.nn.functional as F

from specscale.model import cpu_kernels
from specscale.model.attention import (
    AttentionMetadata,
    padded_prefill_metadata,
    prefill_attention,
    write_kv,
)
from specscale.model.transformer import RMSNorm, apply_rotary

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler: the torch path is used")

# fp32: same roundings, so equal up to the order of a sum; bf16: within one unit in the last place
TOLERANCE = {torch.float32: dict(rtol=1e-6, atol=1e-6), torch.bfloat16: dict(rtol=2**-7, atol=2**-7)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_matches_torch(dtype, with_residual):
    torch.manual_seed(0)
    norm = RMSNorm(40, 1e-6).to(dtype)  # 40: not a multiple of 16
    norm.weight.data = torch.randn(40).to(dtype)
    x = torch.randn(37, 40).to(dtype)
    residual = torch.randn(37, 40).to(dtype) if with_residual else None
    expected, expected_residual = norm(x, None if residual is None else residual.clone(), fused=False)
    out, new_residual = norm(x, residual, fused=True)
    torch.testing.assert_close(out, expected, **TOLERANCE[dtype])
    torch.testing.assert_close(new_residual, expected_residual, rtol=0, atol=0)  # one rounded add
    if with_residual:
        assert new_residual is residual  # updated in place


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 24])
def test_rope_write_kv_matches_torch(dtype, head_dim):
    torch.manual_seed(0)
    heads, kv_heads, tokens, positions_max = 6, 2, 11, 50
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim).to(dtype)
    positions = torch.randint(0, positions_max, (tokens,))
    angles = torch.rand(positions_max, head_dim // 2) * 6.3
    cos, sin = torch.cat([angles, angles], -1).cos().to(dtype), torch.cat([angles, angles], -1).sin().to(dtype)
    slots = torch.randperm(8 * 4)[:tokens]
    caches = [torch.zeros(8, 4, kv_heads, head_dim, dtype=dtype) for _ in range(4)]
    q = cpu_kernels.rope_write_kv(qkv, positions, cos, sin, caches[0], caches[1], slots, heads, kv_heads)
    q_ref, k_ref, v_ref = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q_ref = apply_rotary(q_ref.view(tokens, heads, head_dim), cos[positions], sin[positions])
    k_ref = apply_rotary(k_ref.view(tokens, kv_heads, head_dim), cos[positions], sin[positions])
    write_kv(caches[2], caches[3], k_ref, v_ref.reshape(tokens, kv_heads, head_dim), slots)
    assert torch.equal(q, q_ref)  # same products, same roundings, in the same order
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("intermediate", [64, 40])  # 40: the scalar tail after the 16-lane loop
def test_silu_mul_matches_torch(dtype, intermediate):
    torch.manual_seed(0)
    gate_up = (torch.randn(9, 2 * intermediate) * 6).to(dtype)
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -87.5])  # saturated and zero inputs
    gate, up = gate_up.chunk(2, dim=-1)
    expected = F.silu(gate) * up
    torch.testing.assert_close(cpu_kernels.silu_mul(gate_up), expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("head_dim", [64, 48])  # 64: q.k on bf16 pairs; 48 (odd number of 16-lane rows): widened
def test_bf16_decode_attention_matches_fp32_reference(head_dim):
    torch.manual_seed(0)
    heads, kv_heads, block_size, num_blocks = 8, 2, 16, 40
    context_lens = torch.tensor([1, 17, 40, 95], dtype=torch.int32)  # partial chunks of 16 and blocks
    key_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(torch.bfloat16)
    value_cache = torch.randn_like(key_cache)
    tables = torch.randperm(num_blocks)[:4 * 7].view(4, 7).to(torch.int32)
    q = torch.randn(4, heads, head_dim).to(torch.bfloat16)
    out = cpu_kernels.paged_decode_attention(q, key_cache, value_cache, tables, context_lens, head_dim**-0.5)
    for b, length in enumerate(context_lens.tolist()):
        slots = [tables[b, p // block_size].item() * block_size + p % block_size for p in range(length)]
        k = key_cache.view(-1, kv_heads, head_dim)[slots].float().repeat_interleave(heads // kv_heads, dim=1)
        v = value_cache.view(-1, kv_heads, head_dim)[slots].float().repeat_interleave(heads // kv_heads, dim=1)
        weights = (torch.einsum("hd,thd->ht", q[b].float(), k) * head_dim**-0.5).softmax(-1)  # [H, ctx]
        expected = torch.einsum("ht,thd->hd", weights, v)
        torch.testing.assert_close(out[b].float(), expected, rtol=0, atol=1e-2)  # one bf16 rounding of the output


@pytest.mark.parametrize("dtype,head_dim,heads", [
    (torch.bfloat16, 64, 6), (torch.bfloat16, 48, 6), (torch.float32, 32, 6),
    (torch.bfloat16, 64, 14),  # 7 query heads per KV head (Qwen2.5-0.5B / 7B): passes of 4 and 3 heads
    (torch.bfloat16, 128, 14),  # D = 128: at most 3 heads a pass, so 3 + 2 + 2
    (torch.float32, 128, 16),  # fp32 widened rows, 8 heads per KV head: 3 + 2 + 3
])
def test_prefill_attention_matches_causal_reference(dtype, head_dim, heads):
    """Chunks of new tokens on top of cached contexts (0, 5, 100 tokens; 16-key blocks cut mid-chunk, up to
    150 keys, so scores run in passes of several key blocks and a tail), through every prefill path this
    CPU has: the padded SDPA always, the paged kernel where the build has it (AVX-512 builds only)."""
    torch.manual_seed(0)
    kv_heads, block_size, num_blocks = 2, 16, 40
    starts, counts = torch.tensor([0, 5, 100]), torch.tensor([7, 20, 50])
    key_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype)
    value_cache = torch.randn_like(key_cache)
    tables = torch.randperm(num_blocks)[:3 * 10].view(3, 10).to(torch.int32)
    q = torch.randn(int(counts.sum()), heads, head_dim).to(dtype)
    for out in prefill_outputs(q, key_cache, value_cache, tables, starts, counts, head_dim):
        assert_causal_attention(out, q, key_cache, value_cache, tables, starts, counts)


def prefill_outputs(q, key_cache, value_cache, tables, starts, counts, head_dim) -> list[torch.Tensor]:
    """prefill_attention's output on the padded SDPA path, and on the paged kernel where this build has it."""
    padded = AttentionMetadata(slot_mapping=torch.empty(0), num_decode_tokens=0, decode_block_tables=None,
                               decode_context_lens=None, prefill_starts=starts, prefill_counts=counts,
                               **padded_prefill_metadata(tables.long(), starts, counts, key_cache.shape[1]))
    outputs = [prefill_attention(q, key_cache, value_cache, padded, head_dim**-0.5)]
    if cpu_kernels.has_prefill_kernel(head_dim):
        outputs.append(cpu_kernels.paged_prefill_attention(q, key_cache, value_cache, tables, starts, counts,
                                                           head_dim**-0.5))
    return outputs


def assert_causal_attention(out, q, key_cache, value_cache, tables, starts, counts):
    """out [Tp, H, D] equals fp32 causal attention of each chunk over its cached + new keys."""
    block_size, kv_heads, head_dim = key_cache.shape[1:]
    heads = q.shape[1]
    first = 0
    for b, (start, count) in enumerate(zip(starts.tolist(), counts.tolist(), strict=True)):
        total = start + count
        slots = [tables[b, p // block_size].item() * block_size + p % block_size for p in range(total)]
        k = key_cache.view(-1, kv_heads, head_dim)[slots].float().repeat_interleave(heads // kv_heads, dim=1)
        v = value_cache.view(-1, kv_heads, head_dim)[slots].float().repeat_interleave(heads // kv_heads, dim=1)
        queries = q[first:first + count].float()  # [n, H, D] at positions start .. total - 1
        scores = torch.einsum("qhd,khd->hqk", queries, k) * head_dim**-0.5
        causal = torch.arange(total)[None, :] > (torch.arange(count) + start)[:, None]  # [n, total]
        expected = torch.einsum("hqk,khd->qhd", scores.masked_fill(causal, float("-inf")).softmax(-1), v)
        tolerance = 1e-2 if q.dtype == torch.bfloat16 else 1e-5  # bf16: one rounding of the output
        torch.testing.assert_close(out[first:first + count].float(), expected, rtol=0, atol=tolerance)
        first += count
