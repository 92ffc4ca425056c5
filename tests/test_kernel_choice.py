"""The per-machine kernel choice (model/kernel_choice.py): the fastest measured path, cached, forceable,
the same logits on every path, a tied embedding held once, and a working dispatch on an AVX2-only CPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specscale.config import EngineConfig
from specscale.engine.engine import Engine
from specscale.model import cpu_kernels
from specscale.model.kernel_choice import KernelChoice, LinearShape, bucket_winners, fastest_path
from specscale.model.linear import Linear
from specscale.model.loader import load_model
from specscale.model.machine import MachineFingerprint

MACHINE = MachineFingerprint(cpu="Test CPU", isa_flags=("avx2", "avx512_bf16"), threads=2, torch_version="t")
ALL = ("ours", "onednn", "torch")
SHAPES = [LinearShape(1152, 896, "bfloat16", True), LinearShape(9728, 896, "bfloat16", False),
          LinearShape(896, 4864, "bfloat16", False)]
BUCKETS = (1, 32, 512)


class TableTimer:
    """Measured times from a table (shape key -> path -> rows -> seconds); counts the cells it measured."""

    def __init__(self, table: dict[str, dict[str, dict[int, float]]]):
        self.table, self.calls = table, 0

    def __call__(self, shape: LinearShape, paths, buckets) -> dict[str, dict[int, float]]:
        self.calls += len(paths) * len(buckets)
        return {path: {rows: self.table[shape.key][path][rows] for rows in buckets} for path in paths}


def refuse(shape, paths, buckets):
    raise AssertionError("a cached machine must not measure again")


TABLE = {
    SHAPES[0].key: {"ours": {1: 3.0, 32: 3.0, 512: 30.0}, "onednn": {1: 1.0, 32: 2.0, 512: 10.0},
                    "torch": {1: 9.0, 32: 9.0, 512: 90.0}},  # oneDNN everywhere (an AMX machine)
    SHAPES[1].key: {"ours": {1: 1.0, 32: 1.0, 512: 12.0}, "onednn": {1: 2.0, 32: 1.5, 512: 10.0},
                    "torch": {1: 5.0, 32: 5.0, 512: 50.0}},  # ours at decode sizes, oneDNN at 512 rows
    SHAPES[2].key: {"ours": {1: 4.0, 32: 4.0, 512: 40.0}, "onednn": {1: 4.0, 32: 4.0, 512: 40.0},
                    "torch": {1: 1.0, 32: 1.0, 512: 10.0}},  # F.linear
}


def expected_path(times: dict[str, dict[int, float]]) -> str:
    """The argmin of the geometric mean of each path's time over each bucket's fastest, spelled out."""
    best = {rows: min(t[rows] for t in times.values()) for rows in BUCKETS}
    score = {path: math.prod(t[rows] / best[rows] for rows in BUCKETS) for path, t in times.items()}
    return min(ALL, key=lambda path: score.get(path, math.inf))


def test_the_choice_is_the_fastest_measured_and_a_second_start_measures_nothing(tmp_path):
    timer = TableTimer(TABLE)
    first = KernelChoice("auto", MACHINE, tmp_path, timer)
    chosen = [first.linear_path(shape, ALL, BUCKETS) for shape in SHAPES]
    assert chosen == [expected_path(TABLE[shape.key]) for shape in SHAPES] == ["onednn", "ours", "torch"]
    assert first.winners[SHAPES[1].key] == {1: "ours", 32: "ours", 512: "onednn"}  # reported per bucket
    assert timer.calls == first.timings_taken == len(SHAPES) * len(ALL) * len(BUCKETS)
    second = KernelChoice("auto", MACHINE, tmp_path, refuse)  # the same machine: the cache answers
    assert [second.linear_path(shape, ALL, BUCKETS) for shape in SHAPES] == chosen
    assert second.timings_taken == 0 and "cache hit" in second.describe()
    other = TableTimer(TABLE)  # another fingerprint (more threads): measured afresh, in its own file
    KernelChoice("auto", replace(MACHINE, threads=4), tmp_path, other).linear_path(SHAPES[0], ALL, BUCKETS)
    assert other.calls == len(ALL) * len(BUCKETS) and len(list(tmp_path.glob("kernel-choice-*.json"))) == 2


def test_only_the_paths_that_can_run_a_weight_compete(tmp_path):
    choice = KernelChoice("auto", MACHINE, tmp_path, TableTimer(TABLE))
    assert choice.linear_path(SHAPES[0], ("ours", "torch"), BUCKETS, tied=True) == "ours"  # oneDNN cannot serve
    assert choice.linear_path(SHAPES[1], ("torch",), BUCKETS) == "torch" and choice.timings_taken == 6


def test_a_forced_path_is_taken_where_it_runs_and_falls_back_in_order(tmp_path):
    for mode, candidates, path in [("onednn", ALL, "onednn"), ("ours", ("onednn", "torch"), "onednn"),
                                   ("ours", ("torch",), "torch"), ("torch", ALL, "torch")]:
        assert KernelChoice(mode, MACHINE, tmp_path, refuse).linear_path(SHAPES[0], candidates, BUCKETS) == path


def test_a_prms_linears_are_chosen_for_the_calls_a_search_makes_not_only_the_threshold_batches(tmp_path):
    """A search's PRM calls hold tens to hundreds of tokens (a sibling group, one request in flight); the
    threshold's batches 2,048. A path 2x faster up to 256 rows and 5% slower above must win: timed at 512 and
    2,048 rows only, the PRM took the other one."""
    from specscale.model.transformer import TransformerForProcessReward

    def timer(shape, paths, buckets):  # ours: 2x faster up to 256 rows, 5% slower above
        return {path: {rows: (1.0 if rows <= 256 else 1.05) * rows if path == "ours" else
                       (2.0 if rows <= 256 else 1.0) * rows for rows in buckets} for path in paths}

    choice = KernelChoice("auto", MACHINE, tmp_path, timer)
    buckets = TransformerForProcessReward.row_buckets
    assert min(buckets) <= 64 and max(buckets) >= 2048
    assert choice.linear_path(LinearShape(256, 768, "bfloat16", False), ALL, buckets) == "ours"


def test_fastest_path_and_bucket_winners_break_ties_in_path_order():
    times = {"torch": {8: 1.0}, "onednn": {8: 1.0}}
    assert fastest_path(times) == "onednn" and bucket_winners(times) == {8: "onednn"}


def test_the_real_timer_measures_every_path_it_offers():
    """The default timer runs each path of a small weight and returns positive seconds for every cell."""
    from specscale.model.kernel_timing import time_paths

    layer = Linear(64, 96, bias=True).bfloat16()
    times = time_paths(layer.shape, layer.paths(), (1, 8))
    assert set(times) == set(layer.paths()) and all(0 < t < 1.0 for by_rows in times.values() for t in by_rows.values())


@pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler: no transposed path")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bias", [False, True])
def test_the_transposed_path_equals_f_linear_and_gives_a_row_the_same_result_in_any_batch(dtype, bias):
    torch.manual_seed(0)
    layer = Linear(96, 1000, bias=bias).to(dtype)
    plain = layer.weight.detach().clone(), None if layer.bias is None else layer.bias.detach().clone()
    layer.prepack("transposed")
    assert layer.weight is not None and not layer.is_prepacked  # the plain weight is its layout
    x = torch.randn(37, 96).to(dtype)  # [T, in]
    out = layer(x)  # [T, out]
    exact = torch.nn.functional.linear(x.double(), plain[0].double(), None if plain[1] is None else plain[1].double())
    tolerance = (2.0 ** -7 if dtype == torch.bfloat16 else 1e-5) * exact.abs().max().item()
    assert out.shape == (37, 1000) and out.is_contiguous() and (out.double() - exact).abs().max().item() <= tolerance
    for rows in (1, 5, 16):  # bf16: each row's result does not depend on the rows beside it; fp32 takes MKL's
        # sgemm / gemv, whose kernel (and summation order) depends on the row count on some CPUs (AMD EPYC: 5 rows)
        if dtype == torch.bfloat16:
            assert torch.equal(layer(x[:rows]), out[:rows])
        else:
            assert (layer(x[:rows]).double() - out[:rows].double()).abs().max().item() <= tolerance
    assert torch.equal(cpu_kernels.transpose_matrix(x), x.t())


def engine_logits(path, dtype: str, kernels, prompts) -> list[torch.Tensor]:
    """Head outputs at every prompt position (prefill), then 6 greedy decode steps' logits per prompt."""
    engine = Engine(EngineConfig(model=str(path), dtype=dtype, num_kv_blocks=64, block_size=4, kernels=kernels))
    return engine_logits_on(engine, prompts)


def engine_logits_on(engine, prompts) -> list[torch.Tensor]:
    recorded: dict[int, list[torch.Tensor]] = {}
    original = engine._sample_and_append

    def capture(seqs, logits):
        for seq, row in zip(seqs, logits, strict=True):
            recorded.setdefault(seq.seq_id, []).append(row.float().clone())
        return original(seqs, logits)

    engine._sample_and_append = capture
    from specscale.seam import SamplingParams

    params = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)
    ids = [engine.add(p, params) for p in prompts]
    while engine.has_work():
        engine.step()
    assert engine.block_manager.num_used_blocks == 0
    return [torch.stack(recorded[i]) for i in ids]


PROMPTS = [[5, 17, 3, 99, 41, 7, 250], [8], list(range(20, 60))]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_every_path_gives_the_same_logits(qwen2_dir, dtype):
    """Forced ours / onednn / transposed / torch and auto agree within bf16 rounding (fp32: to 1e-4)."""
    reference = engine_logits(qwen2_dir, "float32", "torch", PROMPTS)
    for kernels in ("torch", "onednn", "ours", "transposed", "auto"):
        for ours, exact in zip(engine_logits(qwen2_dir, dtype, kernels, PROMPTS), reference, strict=True):
            scale = exact.abs().max().item()
            tolerance = 1e-4 * scale if dtype == "float32" else 2.0 ** -6 * scale
            assert (ours - exact).abs().max().item() <= tolerance, (kernels, dtype)


@pytest.mark.parametrize("kernels", ["ours", "torch", "onednn", "transposed", "auto"])
def test_a_tied_embedding_is_held_once_and_looked_up_exactly(qwen2_dir, kernels):
    plain = load_model(qwen2_dir, dtype="bfloat16", kernels="torch")
    model = load_model(qwen2_dir, dtype="bfloat16", kernels=kernels)
    head = model.lm_head
    assert head.path in ("ours", "transposed", "torch") and (head.weight is None) == (head.path == "ours")
    assert not any(isinstance(m, torch.nn.Embedding) for m in model.modules())  # the table is the head's
    ids = torch.arange(model.args.vocab_size)
    assert torch.equal(model.model.embed_tokens(ids), plain.model.embed_tokens(ids))  # every row, bit for bit


def test_health_names_the_machine_and_the_paths(qwen2_dir):
    engine = Engine(EngineConfig(model=str(qwen2_dir), dtype="bfloat16", num_kv_blocks=16, kernels="torch"))
    report = engine.kernels()
    assert report["mode"] == "torch" and set(report["linear_paths"]) == {"torch"}
    assert MachineFingerprint.current().cpu in report["machine"] and "ISA" in report["machine"]
    assert report["attention"] in ("cpp", "torch")


AVX2_SCRIPT = """
import json, sys, torch
sys.path.insert(0, {tests!r})
from test_kernel_choice import engine_logits, PROMPTS
from specscale.model import cpu_kernels
out = {{}}
for dtype in ("bfloat16", "float32"):
    out[dtype] = [l.tolist() for l in engine_logits({model!r}, dtype, "auto", PROMPTS)]
from specscale.config import EngineConfig
from specscale.engine.engine import Engine
engine = Engine(EngineConfig(model={model!r}, dtype="bfloat16", num_kv_blocks=16))
out["kernels"] = engine.kernels()
out["bf16_linear"] = cpu_kernels.has_bf16_linear()
print(json.dumps(out))
"""


@pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler: the torch path is used")
def test_an_avx2_only_cpu_gets_a_working_path(qwen2_dir):
    """SPECSCALE_CPU_ISA=avx2 (+ oneDNN capped at AVX2): no AVX-512 kernels, no oneDNN bf16; same logits."""
    env = dict(os.environ, SPECSCALE_CPU_ISA="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    script = AVX2_SCRIPT.format(tests=str(Path(__file__).parent), model=str(qwen2_dir))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert not out["bf16_linear"] and "forced to avx2" in out["kernels"]["machine"]
    assert "avx512f" not in out["kernels"]["machine"] and out["kernels"]["prefill_attention"] == "torch"
    assert set(out["kernels"]["linear_paths"]) <= {"transposed", "torch"}  # bf16 without AVX-512: plain torch GEMMs
    for dtype in ("bfloat16", "float32"):
        native = engine_logits(qwen2_dir, dtype, "auto", PROMPTS)
        for theirs, ours in zip(out[dtype], native, strict=True):
            theirs = torch.tensor(theirs)
            scale = ours.abs().max().item()
            assert (theirs - ours).abs().max().item() <= (1e-4 if dtype == "float32" else 2.0 ** -6) * scale


def test_attention_takes_the_faster_measured_path_and_caches_it(tmp_path):
    from specscale.model.kernel_choice import AttentionShape

    shape = AttentionShape(14, 2, 64, "bfloat16")
    timings = {"decode": {"cpp": 1.5, "torch": 1.0}, "prefill": {"cpp": 1.2, "torch": 1.0},  # torch 1.5x / 1.2x
               "short-prefill": {"cpp": 0.8, "torch": 1.0}}
    choice = KernelChoice("auto", MACHINE, tmp_path, refuse, lambda s, kind: timings[kind])
    assert choice.attention_path(shape, "decode") == "cpp"  # within the decode margin: the C++ kernels stay
    assert choice.attention_path(shape, "prefill") == "torch"  # prefill: the faster path, no margin
    assert choice.attention_path(shape, "short-prefill") == "cpp"  # short prefills are timed apart
    again = KernelChoice("auto", MACHINE, tmp_path, refuse, lambda s, kind: pytest.fail("cached"))
    assert again.attention_path(shape, "prefill") == "torch" and again.timings_taken == 0
    assert again.attention_path(shape, "short-prefill") == "cpp"


@pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler: the torch path is used")
def test_a_batch_of_short_prefills_takes_the_short_prefill_path_and_the_logits_agree(qwen2_dir):
    """A batch whose rows bring at most SHORT_PREFILL_MAX_TOKENS new tokens runs the path measured for short
    prefills, a longer one the path measured for long ones; either way the logits are the plain-torch ones."""
    from types import SimpleNamespace

    from specscale.model.kernel_choice import SHORT_PREFILL_MAX_TOKENS

    engine = Engine(EngineConfig(model=str(qwen2_dir), dtype="float32", num_kv_blocks=64, block_size=4))
    runner = engine.runner
    runner.use_cpu_kernels, runner.use_prefill_kernel, runner.use_short_prefill_kernel = True, False, True
    rows = lambda *counts: [SimpleNamespace(num_tokens=n) for n in counts]  # noqa: E731
    assert runner._prefill_kernel_for(rows(3, SHORT_PREFILL_MAX_TOKENS)) is True
    assert runner._prefill_kernel_for(rows(3, SHORT_PREFILL_MAX_TOKENS + 1)) is False
    assert "cpp to 64 new tokens a row, torch above" in runner.kernels()["prefill_attention"]
    long_batch, short_batch = [list(range(5, 5 + SHORT_PREFILL_MAX_TOKENS + 9))], [[7, 8, 9], list(range(30, 70))]
    reference = [*engine_logits(qwen2_dir, "float32", "torch", long_batch),
                 *engine_logits(qwen2_dir, "float32", "torch", short_batch)]
    split = [*engine_logits_on(engine, long_batch), *engine_logits_on(engine, short_batch)]
    for ours, exact in zip(split, reference, strict=True):
        assert (ours - exact).abs().max().item() <= 1e-4 * exact.abs().max().item()


@pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler: the torch path is used")
def test_the_real_attention_timer_runs_both_paths():
    from specscale.model.kernel_choice import AttentionShape
    from specscale.model.kernel_timing import time_attention

    shape = AttentionShape(4, 2, 64, "float32")
    for kind in ("decode", "prefill", "short-prefill"):
        times = time_attention(shape, kind)
        assert set(times) == {"cpp", "torch"} and all(0 < t < 1 for t in times.values())


class FakeLayer:
    """A path whose call costs `cold` extra seconds when the path did not run since the last cache eviction
    (oneDNN's primitive and scratchpad gone cold), `base` seconds otherwise."""

    def __init__(self, path: str, warm: set, base: float, cold: float):
        self.path, self.warm, self.base, self.cold = path, warm, base, cold

    def __call__(self, x):
        time.sleep(self.base + (0.0 if self.path in self.warm else self.cold))
        self.warm.add(self.path)
        return x


def test_the_timer_times_a_warm_path_on_a_cold_weight(monkeypatch):
    """The engine's linears run back to back: a path is warm when it runs, only its weight comes from memory.
    A path 3 ms slower when cold but 4x faster when warm (oneDNN on a Xeon with AMX) must win; evicting the
    caches before each timed call alone timed it cold and kept the slower path."""
    from specscale.model import kernel_timing

    warm: set[str] = set()
    costs = {"ours": (0.002, 0.0), "onednn": (0.0005, 0.003)}  # path -> (warm seconds, extra when cold)
    monkeypatch.setattr(kernel_timing, "evict_caches", warm.clear)
    monkeypatch.setattr(kernel_timing, "linear_on_path", lambda shape, path: FakeLayer(path, warm, *costs[path]))
    monkeypatch.setattr(kernel_timing, "BUCKET_BUDGET_S", 0.0)  # MIN_ROUNDS rounds
    times = kernel_timing.time_paths(LinearShape(64, 64, "float32", False), ("ours", "onednn"), (1, 8))
    assert all(times["onednn"][rows] < 0.0015 < 0.0019 < times["ours"][rows] for rows in (1, 8)), times
    assert fastest_path(times) == "onednn"


def test_a_cache_of_another_timing_method_or_a_remeasure_request_measures_again(tmp_path, monkeypatch):
    KernelChoice("auto", MACHINE, tmp_path, TableTimer(TABLE)).linear_path(SHAPES[0], ALL, BUCKETS)
    cache = next(tmp_path.glob("kernel-choice-*.json"))
    stored = json.loads(cache.read_text())
    cache.write_text(json.dumps({**stored, "timing_method": 1}))  # measured the old way (path cold)
    stale = TableTimer(TABLE)
    KernelChoice("auto", MACHINE, tmp_path, stale).linear_path(SHAPES[0], ALL, BUCKETS)
    assert stale.calls == len(ALL) * len(BUCKETS)
    monkeypatch.setenv("SPECSCALE_REMEASURE_KERNELS", "1")
    again = TableTimer(TABLE)
    KernelChoice("auto", MACHINE, tmp_path, again).linear_path(SHAPES[0], ALL, BUCKETS)
    assert again.calls == len(ALL) * len(BUCKETS)


def test_specscale_kernels_prints_the_cached_choice_per_shape_and_bucket(tmp_path):
    from specscale.model.kernel_choice import AttentionShape, format_cached, parse_linear_key

    attention_times = {"decode": {"cpp": 1.0, "torch": 1.5}, "prefill": {"cpp": 1.2, "torch": 1.0}}
    choice = KernelChoice("auto", MACHINE, tmp_path, TableTimer(TABLE), lambda s, kind: attention_times[kind])
    for shape in SHAPES:
        choice.linear_path(shape, ALL, BUCKETS)
    attention = AttentionShape(14, 2, 64, "bfloat16")
    choice.attention_path(attention, "decode"), choice.attention_path(attention, "prefill")
    assert [parse_linear_key(shape.key) for shape in SHAPES] == SHAPES
    text = format_cached(KernelChoice("auto", MACHINE, tmp_path, refuse))  # attention entries cached beside
    assert "Test CPU" in text and f"{SHAPES[0].key}: onednn; a tied head: ours" in text
    assert f"{SHAPES[1].key}: ours" in text and "512 rows -> onednn" in text
    assert f"decode attention {attention.key}: cpp" in text and f"prefill attention {attention.key}: torch" in text
