"""The torch prefill path pads its query grid and keys to a few lengths on CPU (model/prefill_padding.py): the
lengths are few and map to themselves, the padded attention equals the unpadded one, the warm covers the block
shapes a server meets, runs on the engine thread, and after it random prefill shapes leave resident memory flat
(torch's SDPA keeps a micro-kernel per block shape, per thread, forever: the soak's RSS creep, issue 30)."""

from __future__ import annotations

import random
import re
import threading
from functools import partial
from pathlib import Path

import pytest
import torch

from search_backends import scripted_runtime
from specscale.model import attention, prefill_warmup
from specscale.model.attention import AttentionMetadata, padded_prefill_metadata, prefill_attention
from specscale.model.prefill_padding import grid_len, key_len, warm_shapes
from specscale.model.prefill_warmup import warm
from specscale.server.engine_loop import EngineLoop
from specscale.server.metrics import ServerMetrics

H, KVH, D, BS = 4, 2, 64, 16  # the toy models' attention


def test_lengths_are_few_cover_their_input_and_map_to_themselves():
    grids = {grid_len(n) for n in range(1, 2049)}
    keys = {key_len(n) for n in range(BS, 4097, BS)}
    assert len(grids) == 6 + 2048 // 32 - 1 and len(keys) == 2 + 4096 // 64
    for n in range(1, 4097):
        assert n <= grid_len(n) <= n + 31 and grid_len(grid_len(n)) == grid_len(n)
        assert n <= key_len(n) <= n + 63 and key_len(key_len(n)) == key_len(n)


def test_the_warm_covers_every_grid_up_to_1024_and_the_key_tails_past_512():
    pairs = warm_shapes(2048, 2048)
    assert len(pairs) < 500
    assert {g for g, _ in pairs} == {grid_len(n) for n in range(1, 1025)}
    for grid in (1, 32, 96):  # a short grid meets every key length up to 1024: S < 512 and every tail past 512
        assert {k for g, k in pairs if g == grid} >= {key_len(n) for n in range(max(grid, BS), 1025, BS)}
    assert max(k for _, k in pairs) == 1536 and all(k >= g for g, k in pairs)
    assert max(k for _, k in warm_shapes(256, 300)) == key_len(300)  # never past the context


def _random_prefill(rng: random.Random, caches, blocks: int):
    bp = rng.randint(1, 4)
    counts = [rng.randint(1, 200) for _ in range(bp)]
    starts = [0] * bp if rng.random() < 0.3 else [rng.randint(0, 500) for _ in range(bp)]
    width = max(-(-(s + c) // BS) for s, c in zip(starts, counts, strict=True))
    tables = torch.tensor([rng.sample(range(1, blocks), width) for _ in range(bp)])
    q = torch.randn(sum(counts), H, D).to(caches[0].dtype)
    st, ct = torch.tensor(starts), torch.tensor(counts)
    common = {"slot_mapping": st, "num_decode_tokens": 0, "decode_block_tables": None, "decode_context_lens": None}

    def run() -> torch.Tensor:
        meta = AttentionMetadata(**common, **padded_prefill_metadata(tables, st, ct, BS))
        return prefill_attention(q, caches[0], caches[1], meta, D**-0.5)

    return run


def _caches(blocks: int, dtype: torch.dtype):
    return [torch.randn(blocks, BS, KVH, D).to(dtype) for _ in range(2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padded_prefill_attention_equals_the_unpadded(monkeypatch, dtype):
    rng, blocks = random.Random(0), 128
    caches = _caches(blocks, dtype)
    for _ in range(12):
        run = _random_prefill(rng, caches, blocks)
        padded = run()
        with monkeypatch.context() as m:
            m.setattr(attention, "pads_sdpa", lambda device: False)
            plain = run()
        assert padded.shape == plain.shape
        torch.testing.assert_close(padded, plain, atol=2e-2 if dtype == torch.bfloat16 else 1e-5, rtol=0)


def test_the_torch_decode_path_pads_its_keys_and_gives_the_unpadded_result(monkeypatch):
    rng, blocks = random.Random(2), 64
    caches = _caches(blocks, torch.bfloat16)
    lens = torch.tensor([5, 40, 70])  # 5 blocks wide: 80 keys, padded to 128
    tables = torch.tensor([rng.sample(range(1, blocks), 5) for _ in range(3)])
    q = torch.randn(3, H, D).to(torch.bfloat16)
    padded = attention.decode_attention(q, caches[0], caches[1], tables, lens, D**-0.5, False)
    monkeypatch.setattr(attention, "pads_sdpa", lambda device: False)
    plain = attention.decode_attention(q, caches[0], caches[1], tables, lens, D**-0.5, False)
    torch.testing.assert_close(padded, plain, atol=2e-2, rtol=0)


def test_the_metadata_pads_grid_and_keys_on_cpu():
    tables = torch.tensor([[3, 4, 5], [6, 7, 0]])  # 48 keys
    fields = padded_prefill_metadata(tables, torch.tensor([10, 0]), torch.tensor([33, 20]), BS)
    assert fields["prefill_query_len"] == 64 and fields["prefill_block_tables"].shape == (2, 4)  # 64 keys
    assert fields["prefill_mask"].shape == (2, 1, 64, 64)
    assert fields["prefill_query_index"].tolist() == list(range(33)) + list(range(64, 84))


def test_the_engine_loop_runs_its_warm_first_on_its_own_thread():
    seen = []
    loop = EngineLoop(partial(scripted_runtime, 4), ServerMetrics(), max_waiting=8,
                      warm=lambda: seen.append(threading.current_thread().name))
    loop.start()
    loop.stop()
    assert seen == ["specscale-engine"]


def _rss_mib() -> float:
    return int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text())[1]) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_after_the_warm_random_prefill_shapes_leave_resident_memory_flat():
    """Without the padding this loop grew a process by ~190 MiB on a Xeon with AMX (bf16 SDPA on brgemm)."""
    blocks = 128
    caches = _caches(blocks, torch.bfloat16)
    warm(H, KVH, D, torch.bfloat16, 512, blocks * BS)
    rng = random.Random(1)
    for _ in range(100):  # allocator high-water marks of the buffers first
        _random_prefill(rng, caches, blocks)()
    before = _rss_mib()
    for _ in range(800):
        _random_prefill(rng, caches, blocks)()
    assert _rss_mib() - before < 24


def test_warm_engines_skips_engines_on_the_prefill_kernel_or_without_a_model():
    class Runner:
        def __init__(self, use_prefill_kernel):
            self.use_prefill_kernel, self.device, self.dtype = use_prefill_kernel, torch.device("cpu"), torch.float32
            self.model = type("M", (), {"args": type("A", (), {"num_heads": H, "num_kv_heads": KVH, "head_dim": D})})

    class Engine:
        def __init__(self, runner):
            self.runner, self.max_model_len = runner, 64
            self.config = type("C", (), {"max_num_batched_tokens": 32})

    calls = prefill_warmup.warm_engines([Engine(Runner(True)), Engine(Runner(False)), Engine(Runner(False)),
                                          Engine(type("Sim", (), {})())])
    assert calls == 2 * len(warm_shapes(32, 64))  # the two identical torch-path engines warm once
