"""The bf16 linear kernel (model/cpu_kernels.py `bf16_linear`, model/linear.py `Linear`).

Each output element is the fp32 sum of its K bf16 products (exact in fp32), rounded to bf16 once: it lies
within half a bf16 ulp of the exact value plus the fp32 summation error. A row's result does not depend on
the rows it is computed with (every element sums its products in the same order), which the engine relies
on nowhere for correctness but which makes a request's tokens independent of its batch.
"""

from __future__ import annotations

import pytest
import torch

from specscale.model import cpu_kernels
from specscale.model.linear import Linear

pytestmark = pytest.mark.skipif(not cpu_kernels.has_bf16_linear(), reason="needs a CPU with AVX512-BF16")

# (N, K): a decode-sized layer, N not a multiple of the 48-column block, K past one 1024-pair chunk (so
# partial sums cross chunks), a tiny one
SHAPES = [(1152, 896), (100, 4500), (50, 64), (5, 2)]
ROWS = [1, 7, 8, 9, 64, 129, 300]  # tiles of 8 and their remainders, past one 128-row group


def exact(x, weight, bias):
    out = x.double() @ weight.double().t()
    return out if bias is None else out + bias.double()


@pytest.mark.parametrize("n, k", SHAPES)
def test_bf16_linear_is_the_exact_product_rounded_once(n, k):
    torch.manual_seed(n + k)
    weight, bias = (torch.randn(n, k) * 0.05).bfloat16(), torch.randn(n).bfloat16()
    packed = cpu_kernels.pack_bf16_linear(weight)
    for rows in ROWS:
        x = torch.randn(rows, k).bfloat16()
        for b in (bias, None):
            out = cpu_kernels.bf16_linear(x, packed, n, b)
            assert out.shape == (rows, n) and out.dtype == torch.bfloat16
            reference = exact(x, weight, b)
            # half a bf16 ulp (2^-9 relative) + fp32 summation error of K products of size |x||w|
            bound = reference.abs() * 2.0**-8 + k * 2.0**-22 * (x.double().abs() @ weight.double().abs().t())
            assert ((out.double() - reference).abs() <= bound + 1e-30).all()


@pytest.mark.parametrize("n, k", SHAPES)
def test_a_rows_result_does_not_depend_on_its_batch(n, k):
    torch.manual_seed(1)
    weight, bias = (torch.randn(n, k) * 0.05).bfloat16(), torch.randn(n).bfloat16()
    packed = cpu_kernels.pack_bf16_linear(weight)
    x = torch.randn(300, k).bfloat16()
    whole = cpu_kernels.bf16_linear(x, packed, n, bias)
    for row in (0, 7, 8, 127, 128, 299):
        assert torch.equal(cpu_kernels.bf16_linear(x[row : row + 1], packed, n, bias)[0], whole[row])
    assert torch.equal(cpu_kernels.bf16_linear(x[5:70], packed, n, bias), whole[5:70])


def test_bf16_linear_refuses_a_weight_packed_for_another_width():
    packed = cpu_kernels.pack_bf16_linear(torch.randn(16, 64).bfloat16())
    with pytest.raises(RuntimeError, match="packed by pack_bf16_linear"):
        cpu_kernels.bf16_linear(torch.randn(2, 32).bfloat16(), packed, 16)
    with pytest.raises(RuntimeError, match="even K"):
        cpu_kernels.pack_bf16_linear(torch.randn(16, 63).bfloat16())


def test_linear_offers_our_kernel_for_bf16_with_an_even_k_only():
    torch.manual_seed(0)
    layers = {dtype: Linear(96, 160, bias=True).to(dtype) for dtype in (torch.bfloat16, torch.float32)}
    odd = Linear(95, 16, bias=False).bfloat16()  # an odd K has no (k, k+1) pairs: oneDNN or F.linear
    assert layers[torch.bfloat16].paths()[0] == "ours" and "ours" not in layers[torch.float32].paths()
    assert "ours" not in odd.paths() and odd.paths()[-1] == "torch"
    layers[torch.bfloat16].prepack("ours")
    layers[torch.float32].prepack("onednn")
    odd.prepack(odd.paths()[0])
    assert layers[torch.bfloat16].packed_bf16 is not None and layers[torch.bfloat16].packed is None
    assert layers[torch.float32].packed_bf16 is None and layers[torch.float32].packed is not None
    assert odd.packed_bf16 is None
    x = torch.randn(3, 95).bfloat16()
    assert odd(x).shape == (3, 16)
