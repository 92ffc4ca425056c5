"""One copy of every weight on CPU, and the memory report that says so (model/memory.py)."""

import gc

import pytest
import torch
from safetensors import safe_open

from checkpoints import build_checkpoint
from specscale.config import EngineConfig
from specscale.engine.engine import Engine
from specscale.model.linear import Linear, can_prepack
from specscale.model.loader import load_model
from specscale.model.memory import process_resident_bytes, weight_bytes

SHAPE = dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, tie_word_embeddings=False)  # ~15M parameters, 61 MB in fp32


@pytest.fixture(scope="module")
def midsize_dir(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("midsize"), "qwen2", **SHAPE)


def checkpoint_bytes(path) -> int:
    total = 0
    with safe_open(str(path / "model.safetensors"), framework="pt") as handle:
        for name in handle.keys():
            shape = handle.get_slice(name).get_shape()
            total += torch.Size(shape).numel() * 4  # saved in fp32
    return total


def test_loading_adds_one_copy_of_the_weights_to_resident_memory(midsize_dir):
    """The old loader kept a plain and a prepacked copy of every linear weight: RSS grew by ~2x the weights."""
    warm = load_model(midsize_dir, dtype="float32")  # warm-up: oneDNN, the loader's imports; kept alive so
    gc.collect()  # that the measured load cannot reuse its freed memory
    before = process_resident_bytes()
    model = load_model(midsize_dir, dtype="float32")
    grown = process_resident_bytes() - before
    weights = checkpoint_bytes(midsize_dir)
    assert weights > 50 * 2**20
    # one copy is 1.0x plus allocator slack, which depends on what the process ran before (1.34x once, late in
    # the full suite); the bug this guards against held two copies (2.0x)
    assert grown < 1.5 * weights, f"loading {weights / 2**20:.0f} MiB of weights grew RSS by {grown / 2**20:.0f} MiB"
    del model, warm


def test_model_memory_counts_each_weight_once(midsize_dir):
    engine = Engine(EngineConfig(model=str(midsize_dir), dtype="float32", num_kv_blocks=32))
    memory = engine.model_memory()
    assert memory.weight_bytes == checkpoint_bytes(midsize_dir)  # packed or plain, never both
    args = engine.runner.model.args
    per_block = 2 * args.num_layers * 16 * args.num_kv_heads * args.head_dim * 4
    assert memory.kv_cache_bytes == 32 * per_block
    assert memory.rope_table_bytes == 2 * args.max_position_embeddings * args.head_dim * 4
    assert memory.total_bytes == memory.weight_bytes + memory.kv_cache_bytes + memory.rope_table_bytes
    assert memory.as_dict()["device"] == "cpu"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kernels", ["auto", "ours", "onednn", "transposed", "torch"])
def test_a_tied_model_holds_its_embedding_once(qwen2_dir, dtype, kernels):
    """The packed LM head and the embedding lookup share one buffer, whichever path packs the head."""
    model = load_model(qwen2_dir, dtype=dtype, kernels=kernels)
    element = 2 if dtype == "bfloat16" else 4
    padding = sum(m.packed_bf16.numel() - m.out_features * m.in_features for m in model.modules()  # ours: 48-column blocks
                  if isinstance(m, Linear) and m.packed_bf16 is not None) * element
    assert weight_bytes(model) == checkpoint_bytes(qwen2_dir) * element // 4 + padding
    assert model.lm_head.path in ("ours", "transposed", "torch")  # the layouts a lookup can read


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prepacked_linear_keeps_only_the_packed_weight_and_computes_the_same(dtype):
    """Where oneDNN prepacking applies, only the packed weight stays; where it does not (e.g. bf16 on an
    AVX2-only CPU), the plain weight is the one copy. Either way the output equals F.linear's."""
    packable = can_prepack(torch.device("cpu"), dtype)
    torch.manual_seed(0)
    linear = Linear(96, 160, bias=True).to(dtype)
    weight, bias = linear.weight.detach().clone(), linear.bias.detach().clone()
    if packable:
        linear.prepack("onednn")
    assert (linear.weight is None) == packable and linear.is_prepacked == packable
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    for rows in (1, 3, 8, 40):
        x = torch.randn(rows, 96, dtype=dtype)
        torch.testing.assert_close(linear(x), torch.nn.functional.linear(x, weight, bias), rtol=tolerance, atol=tolerance)
