"""The fused C++ kernels at decode shapes (rows 1..64, Qwen2.5-0.5B / 1.5B widths) and at the widths that
exercise their 16-lane loops' masked tails, against the plain-torch path of model/transformer.py; and the
bf16 rounding of the vectorised narrowing on ties, NaN, infinities, signed zeros and subnormals."""

import pytest
import torch
import torch.nn.functional as F

from specscale.model import cpu_kernels
from specscale.model.attention import write_kv
from specscale.model.transformer import RMSNorm, apply_rotary

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler: the torch path is used")

TOLERANCE = {torch.float32: dict(rtol=1e-6, atol=1e-6), torch.bfloat16: dict(rtol=2**-7, atol=2**-7),
             torch.float16: dict(rtol=2**-10, atol=2**-10)}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ROWS = [1, 3, 17, 64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", [1, 17, 896, 1536])
def test_add_rms_norm_at_decode_shapes(dtype, rows, hidden):
    torch.manual_seed(rows * hidden)
    norm = RMSNorm(hidden, 1e-6).to(dtype)
    norm.weight.data = torch.randn(hidden).to(dtype)
    x, residual = torch.randn(rows, hidden).to(dtype), torch.randn(rows, hidden).to(dtype)
    expected, expected_residual = norm(x, residual.clone(), fused=False)
    out, new_residual = norm(x, residual, fused=True)
    assert torch.equal(new_residual, expected_residual)  # one rounded add, bit for bit
    torch.testing.assert_close(out, expected, **TOLERANCE[dtype])
    alone, _ = norm(x, None, fused=True)  # no residual: x is normalised as it is
    torch.testing.assert_close(alone, norm(x, None, fused=False)[0], **TOLERANCE[dtype])


def test_bf16_narrowing_rounds_like_torch_on_ties_and_special_values():
    """x + residual in bf16 through the kernel's vectorised rounding equals torch's, bit for bit: ties to
    even (both ways), overflow to inf, inf - inf = NaN, NaN, signed zeros, subnormals; 40 values so that
    the masked tail of the 16-lane loop is rounded too."""
    one_ulp, half_ulp = 2.0**-7, 2.0**-8
    pairs = [(1.0, half_ulp), (1.0 + one_ulp, half_ulp), (-1.0, -half_ulp), (-(1.0 + one_ulp), -half_ulp),
             (1.0, half_ulp + 2.0**-16), (3.0e38, 3.0e38), (-3.0e38, -3.0e38), (float("inf"), float("-inf")),
             (float("nan"), 1.0), (0.0, -0.0), (-0.0, -0.0), (2.0**-130, 2.0**-133), (-(2.0**-133), 2.0**-132),
             (2.0**-126, -(2.0**-133)), (1.5, 2.0**-9), (255.0, 0.5)]
    pairs = pairs + pairs[:8] + pairs  # 40: two full chunks of 16 and a tail of 8
    x = torch.tensor([a for a, _ in pairs]).to(torch.bfloat16)[None]  # [1, 40]
    residual = torch.tensor([b for _, b in pairs]).to(torch.bfloat16)[None]
    expected = x + residual
    cpu_kernels.add_rms_norm(x, residual, torch.ones(40, dtype=torch.bfloat16), 1e-6)
    # torch's own NaN bits differ between its vectorised and scalar paths (0xFFFF / 0x7FC0): NaN is NaN
    assert torch.equal(residual.isnan(), expected.isnan())
    numbers = ~expected.isnan()
    assert torch.equal(residual[numbers].view(torch.int16), expected[numbers].view(torch.int16))  # same bits


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("intermediate", [1, 15, 17, 4864])
def test_silu_mul_at_decode_shapes(dtype, rows, intermediate):
    torch.manual_seed(rows * intermediate)
    gate_up = (torch.randn(rows, 2 * intermediate) * 5).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(cpu_kernels.silu_mul(gate_up), F.silu(gate) * up, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", ROWS)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(14, 2, 64), (12, 2, 128), (3, 1, 40), (2, 1, 2)])
def test_rope_write_kv_at_decode_shapes(dtype, tokens, heads, kv_heads, head_dim):
    """Bit for bit: the same products rounded where torch rounds (head_dim 40: half a head is 20 lanes)."""
    torch.manual_seed(tokens * head_dim)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim).to(dtype)
    positions = torch.randint(0, 300, (tokens,))
    angles = torch.rand(300, head_dim // 2) * 6.3
    cos, sin = torch.cat([angles, angles], -1).cos().to(dtype), torch.cat([angles, angles], -1).sin().to(dtype)
    slots = torch.randperm(16 * 8)[:tokens]
    caches = [torch.zeros(8, 16, kv_heads, head_dim, dtype=dtype) for _ in range(4)]
    q = cpu_kernels.rope_write_kv(qkv, positions, cos, sin, caches[0], caches[1], slots, heads, kv_heads)
    q_ref, k_ref, v_ref = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q_ref = apply_rotary(q_ref.view(tokens, heads, head_dim), cos[positions], sin[positions])
    k_ref = apply_rotary(k_ref.view(tokens, kv_heads, head_dim), cos[positions], sin[positions])
    write_kv(caches[2], caches[3], k_ref, v_ref.reshape(tokens, kv_heads, head_dim), slots)
    assert torch.equal(q, q_ref)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
