"""One composition root: the real stack (the bundled toy checkpoints) and the simulated one resolve the
LV threshold and the speculative row budget through the same functions (stack.py)."""

import specscale.pipeline as pipeline_module
import specscale.sim.simulation as simulation_module
from specscale.defaults import TOY_GENERATOR, TOY_PRM
from specscale.pipeline import Pipeline, PipelineConfig
from specscale.sim import row_budget
from specscale.sim.simulation import Simulation, SimulationConfig
from specscale.sim.workload import TOY
from specscale.verify import profile


def test_both_stacks_take_each_device_property_from_the_one_resolver(monkeypatch):
    assert pipeline_module.resolve_row_budget is simulation_module.resolve_row_budget is row_budget.resolve_row_budget
    assert pipeline_module.resolve_lv_threshold is simulation_module.resolve_lv_threshold \
        is profile.resolve_lv_threshold
    calls = []

    def rows(override, cost_model, generator, max_rows):
        calls.append("rows")
        return 5

    def threshold(override, profiled):
        calls.append("lv")
        return 333

    for module in (pipeline_module, simulation_module):
        monkeypatch.setattr(module, "resolve_row_budget", rows)
        monkeypatch.setattr(module, "resolve_lv_threshold", threshold)
    pipeline = Pipeline(PipelineConfig(generator_kv_gb=0.1, prm_kv_gb=0.1))
    simulation = Simulation(SimulationConfig(hardware="cpu", generator=str(TOY_GENERATOR), prm=str(TOY_PRM),
                                             workload=TOY))
    try:
        assert calls == ["rows", "lv", "rows", "lv"]
        for stack in (pipeline, simulation):
            assert stack.engine.scheduler.spare_rows == stack.spare_rows == 5
            assert stack.lv_threshold_tokens == 333
            assert stack.runtime().lv_threshold_tokens == 333
    finally:
        pipeline.close()
        simulation.close()


def test_the_lv_resolver_prefers_the_override_then_the_profile_then_the_default():
    assert profile.resolve_lv_threshold(100, 700) == 100
    assert profile.resolve_lv_threshold(None, 700) == 700
    assert profile.resolve_lv_threshold(None, None) == profile.DEFAULT_LV_THRESHOLD == 2048


def test_the_row_budget_resolver_is_unbounded_without_a_cost_model():
    assert row_budget.resolve_row_budget(7, None, None, 512) == 7
    assert row_budget.resolve_row_budget(None, None, None, 512) is None
