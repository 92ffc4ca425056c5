"""The measured decode curve and the speculative row budget it gives (engine/decode_profile.py)."""

import pytest

from specscale.costmodel.cost import RooflineCostModel
from specscale.costmodel.hardware import HardwareProfile
from specscale.costmodel.model_profile import ModelProfile
from specscale.costmodel.row_budget import resolve_row_budget
from specscale.defaults import TOY_GENERATOR
from specscale.engine.decode_profile import (
    DecodeProfileConfig,
    default_profile_path,
    load_row_budget,
    profile_decode,
    row_budget_from_curve,
    save_profile,
)
from specscale.pipeline import Pipeline, PipelineConfig, device_properties


def test_a_cpu_like_curve_gives_fixed_cost_over_per_row_cost():
    rows = (1, 2, 4, 8, 16, 32, 64)
    seconds = tuple(1.0 + 0.1 * r for r in rows)  # t = fixed + R x per_row: budget fixed / per_row = 10
    assert row_budget_from_curve(rows, seconds, 512) == 10
    assert row_budget_from_curve(rows, seconds, 6) == 6  # capped


def test_a_gpu_like_curve_gives_its_compute_knee():
    rows = (1, 16, 32, 64, 128, 256)
    seconds = (1.0, 1.0, 1.0, 1.0, 2.0, 4.0)  # memory-bound (flat) to 64 rows, then a row's FLOPs each
    assert row_budget_from_curve(rows, seconds, 512) == 64


def test_a_curve_still_cheap_at_its_last_point_extrapolates_its_last_segment():
    rows = (1, 4, 16)
    seconds = (1.0, 1.0 + 0.03, 1.0 + 0.15)  # per row 0.01: the rule meets the last segment's line near 100
    assert 95 <= row_budget_from_curve(rows, seconds, 512) <= 101


def test_the_budget_prefers_the_flag_then_the_measurement_then_the_cost_model():
    cpu = RooflineCostModel(HardwareProfile.load("cpu"))
    toy = ModelProfile.load(str(TOY_GENERATOR))
    modelled = resolve_row_budget(None, cpu, toy, 512)
    assert resolve_row_budget(None, cpu, toy, 512, measured=modelled + 5) == modelled + 5
    assert resolve_row_budget(3, cpu, toy, 512, measured=modelled + 5) == 3
    assert resolve_row_budget(None, None, toy, 512) is None


def test_a_measured_profile_is_what_the_real_stack_uses(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSCALE_DECODE_PROFILE_DIR", str(tmp_path))
    config = PipelineConfig(generator_kv_gb=0.1, prm_kv_gb=0.1)
    before = device_properties(config).spare_rows
    profile = profile_decode(DecodeProfileConfig(model=str(TOY_GENERATOR), rows=(1, 2, 4), repeats=1, steps=3))
    assert profile.rows == (1, 2, 4) and all(s > 0 for s in profile.seconds) and profile.budget >= 1
    save_profile(profile, default_profile_path(TOY_GENERATOR, "cpu"))
    assert load_row_budget(TOY_GENERATOR, "cpu") == profile.budget
    pipeline = Pipeline(config)
    assert pipeline.engine.scheduler.spare_rows == min(profile.budget, config.max_num_seqs)
    pipeline.close()
    assert before is not None  # without a measurement the bundled cpu profile's budget applies


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        DecodeProfileConfig(model="x", rows=(4,))
    with pytest.raises(ValueError):
        DecodeProfileConfig(model="x", steps=1)
