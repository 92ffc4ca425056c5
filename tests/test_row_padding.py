"""Row padding of the linears that run on oneDNN (model/row_padding.py, model/linear.py `Linear`).

oneDNN caches a JIT primitive per distinct row count; the engine's batches have arbitrary row counts, so the
rows are padded to 8 sizes per octave (docs/bench/serve-soak.md, "Soak"). Here: the sizes are few, pad little and
map to themselves; a padded linear's output equals the unpadded one's on every path that pads (exactly where
no padding happens, within the rounding a different kernel blocking may bring otherwise); the paths that do
not run on oneDNN are not padded."""

from __future__ import annotations

import pytest
import torch

from specscale.model import row_padding
from specscale.model.kernel_choice import forced_path
from specscale.model.linear import Linear
from specscale.model.row_padding import STEPS_PER_OCTAVE, pad_rows, padded_rows, pads_rows


def test_bucket_sizes_are_few_pad_at_most_an_eighth_and_map_to_themselves():
    sizes = [padded_rows(rows) for rows in range(1, 4097)]
    assert sizes[: 2 * STEPS_PER_OCTAVE - 1] == list(range(1, 2 * STEPS_PER_OCTAVE))  # decode batches: exact
    for rows, size in enumerate(sizes, start=1):
        assert rows <= size <= rows * 1.125 and padded_rows(size) == size
    assert sizes == sorted(sizes)
    assert len(set(sizes)) == 15 + STEPS_PER_OCTAVE * 8 + 1  # 1..15, 8 per octave from 16 to 4095, 4096
    for octave in range(4, 12):  # [2^k, 2^(k+1)): exactly STEPS_PER_OCTAVE sizes
        assert len({size for size in sizes if 1 << octave <= size < 2 << octave}) == STEPS_PER_OCTAVE


def test_pad_rows_appends_zero_rows_and_leaves_a_bucket_size_alone():
    x = torch.randn(17, 4)
    padded = pad_rows(x)
    assert padded.shape == (18, 4) and torch.equal(padded[:17], x) and not padded[17:].any()
    same = torch.randn(16, 4)
    assert pad_rows(same) is same
    three_d = torch.randn(17, 2, 4)
    assert pad_rows(three_d) is three_d


def test_only_the_paths_that_run_on_onednn_pad():
    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert pads_rows("onednn", torch.float32, cpu) and pads_rows("onednn", torch.bfloat16, cpu)
    assert not pads_rows("ours", torch.bfloat16, cpu)
    assert not pads_rows("torch", torch.float32, cpu)  # MKL's sgemm: no per-shape cache
    assert pads_rows("torch", torch.bfloat16, cpu) == row_padding.onednn_runs_bf16()
    assert not pads_rows("onednn", torch.bfloat16, meta)


def _linear(out_features: int, in_features: int, dtype: torch.dtype, path: str) -> Linear:
    """A Linear on `path`, or on the path a forced mode falls back to where `path` cannot run here (an
    AVX2-only CPU has no oneDNN bf16), with its rows padded whatever the path: padding is the same
    mechanism on every path, so these tests run on every CPU."""
    torch.manual_seed(out_features + in_features)
    linear = Linear(in_features, out_features, bias=True).to(dtype)
    linear.prepack(forced_path(path, linear.paths()))
    linear.pad_rows = True
    return linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", ["onednn", "torch"])
@pytest.mark.parametrize("shape", [(1536, 256), (256, 768)])
def test_a_padded_linear_gives_the_unpadded_result(dtype, path, shape):
    linear = _linear(*shape, dtype, path)
    tolerance = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
    for rows in (1, 9, 17, 33, 100, 250, 257, 513, 700):
        x = torch.randn(rows, shape[1]).to(dtype)
        padded = linear(x)
        linear.pad_rows = False
        unpadded = linear(x)
        linear.pad_rows = True
        assert padded.shape == unpadded.shape == (rows, shape[0]) and padded.is_contiguous()
        if padded_rows(rows) == rows:
            assert torch.equal(padded, unpadded)
        else:
            torch.testing.assert_close(padded, unpadded, **tolerance)


def test_a_padded_linear_runs_only_bucket_sizes(monkeypatch):
    linear = _linear(64, 32, torch.float32, "onednn")
    seen = []
    original = torch.nn.functional.pad

    def recording_pad(x, pad, *args, **kwargs):
        out = original(x, pad, *args, **kwargs)
        seen.append(out.shape[0])
        return out

    monkeypatch.setattr(row_padding.F, "pad", recording_pad)
    for rows in range(1, 300):
        linear(torch.randn(rows, 32))
    assert set(seen) <= {padded_rows(rows) for rows in range(1, 300)} and len(set(seen)) < 50
    assert all(padded_rows(size) == size for size in seen)


def test_warm_runs_each_distinct_padded_linear_once_at_every_bucket_size(monkeypatch):
    """At load, `warm` runs every size a padded linear can meet, so its primitives exist before serving (one
    per shape: linears of the same shape share oneDNN's); unpadded linears and runners without a model are
    left alone."""
    from types import SimpleNamespace

    from specscale.model.row_padding import bucket_sizes, warm, warm_engines

    model = torch.nn.Sequential(*(_linear(64, 32, torch.float32, "onednn") for _ in range(3)),
                                _linear(32, 64, torch.float32, "onednn"), Linear(32, 32))
    runs: list[tuple[int, int]] = []
    for module in model:
        original = module.forward
        module.forward = lambda x, original=original, module=module: runs.append((id(module), x.shape[0])) \
            or original(x)
    assert bucket_sizes(40) == [*range(1, 16), 16, 18, 20, 22, 24, 26, 28, 30, 32, 36, 40]
    assert warm(model, 40) == 2 * len(bucket_sizes(40)) == len(runs)
    assert {module for module, _ in runs} == {id(model[0]), id(model[3])}  # one of the three alike, no torch fp32
    assert sorted(rows for module, rows in runs if module == id(model[0])) == bucket_sizes(40)
    engines = [SimpleNamespace(runner=SimpleNamespace(model=model), config=SimpleNamespace(max_num_batched_tokens=8)),
               SimpleNamespace(runner=SimpleNamespace(), config=SimpleNamespace(max_num_batched_tokens=8))]
    assert warm_engines(engines) == 2 * 8
