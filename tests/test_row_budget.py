"""The speculative row budget (costmodel/row_budget.py): derived from the device's cost model, the same code on the real
engine and the simulator; and speculative rows ranked by their parent's survival chance (search/search.py)."""

import pytest

from specscale.costmodel.cost import CostModel, IterationWork, RooflineCostModel, compute_seconds, weight_bytes
from specscale.costmodel.hardware import HardwareProfile
from specscale.costmodel.model_profile import ModelProfile
from specscale.costmodel.row_budget import hardware_profile_for, speculative_row_budget
from specscale.defaults import TOY_GENERATOR, TOY_PRM
from specscale.pipeline import Pipeline, PipelineConfig
from specscale.search.presets import preset_config
from specscale.search.protocol import Expand, ScoresArrived, SetPriority, StepFinished, Verify
from specscale.search.search import Search
from specscale.search.speculation import SPECULATION_BAND
from specscale.sim.simulation import Simulation, SimulationConfig
from specscale.sim.workload import TOY


class Linear(CostModel):
    """t(R) = fixed + R x per_row, as the CPU profile fits a decode iteration."""

    def __init__(self, fixed: float, per_row: float):
        self.fixed, self.per_row = fixed, per_row

    def iteration_seconds(self, model, work, role):
        return self.fixed + work.num_rows * self.per_row


SEVEN_B = ModelProfile.load("qwen2.5-7b-instruct")


def test_on_a_linear_cost_the_budget_is_the_fixed_cost_over_the_per_row_cost():
    assert speculative_row_budget(Linear(1.0, 0.125), SEVEN_B, 512) == 8
    assert speculative_row_budget(Linear(1.0, 1 / 128), SEVEN_B, 512) == 128
    assert speculative_row_budget(Linear(1.0, 1e-6), SEVEN_B, 64) == 64  # capped by the scheduler's rows


def test_on_a_gpu_roofline_the_budget_is_the_decodes_compute_knee():
    a100 = RooflineCostModel(HardwareProfile.load("a100-80gb"))
    budget = speculative_row_budget(a100, SEVEN_B, 512)

    def bound(rows):  # which roof the GEMM phase of an iteration of `rows` decode rows sits on
        work = IterationWork(decode_contexts=(256,) * rows, head_rows=rows, live_sequences=rows)
        compute = compute_seconds(a100.hardware, SEVEN_B, work)  # the GEMMs at their rows' rate
        memory = weight_bytes(SEVEN_B, work) / a100.hardware.achievable_bandwidth  # the weights, read once
        return "compute" if compute > memory else "memory"

    assert 64 < budget < 512
    assert bound(budget - 8) == "memory" and bound(budget + 8) == "compute"


def test_the_real_engine_and_the_simulator_take_the_same_budget_from_the_same_code():
    pipeline = Pipeline(PipelineConfig(generator_kv_gb=0.1, prm_kv_gb=0.1))
    simulation = Simulation(SimulationConfig(hardware="cpu", generator=str(TOY_GENERATOR), prm=str(TOY_PRM),
                                             workload=TOY))
    assert pipeline.engine.scheduler.spare_rows == simulation.engine.scheduler.spare_rows == simulation.device.spare_rows
    assert 2 <= pipeline.engine.scheduler.spare_rows < 32  # the old fixed CPU cap was 32
    pipeline.close()
    simulation.close()


def test_a_flag_overrides_the_budget():
    pipeline = Pipeline(PipelineConfig(generator_kv_gb=0.1, prm_kv_gb=0.1, spare_rows=7))
    assert pipeline.engine.scheduler.spare_rows == 7
    pipeline.close()
    assert Simulation(SimulationConfig(spare_rows=9)).engine.scheduler.spare_rows == 9


@pytest.mark.parametrize("name, profile", [("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA H100 80GB HBM3", "h100-80gb"),
                                           ("NVIDIA H200", "h200"), ("Tesla T4", None)])
def test_a_gpu_finds_its_profile_by_name(name, profile):
    found = hardware_profile_for("cuda", name)
    assert (found.name if found else None) == profile


# ---- survival ranking --------------------------------------------------------------------------------------
def test_speculative_children_are_ranked_by_their_parents_standing_in_the_round():
    search = Search(preset_config("naive-spec", beam_size=8, beam_width=4, seed=1))  # no pruning: all stay
    expands = [a for a in search.start(0.0) if isinstance(a, Expand)]
    verify = {}
    for handle, e in enumerate(expands):
        for action in search.on(StepFinished(e.expansion_id, 100 + handle, f"step {handle}", 3, (0,), False, 0.0)):
            if isinstance(action, Verify):
                verify[handle] = action.candidate

    def score(handle, value):
        return search.on(ScoresArrived(verify[handle], (value,), None, 1.0))

    first = [a for a in score(0, 0.6) if isinstance(a, Expand)]
    assert {a.priority for a in first} == {-SPECULATION_BAND}  # the best so far: rank 0
    second = [a for a in score(1, 0.4) if isinstance(a, Expand)]
    assert {a.priority for a in second} == {-SPECULATION_BAND - 1}  # one verified copy above it
    actions = score(2, 0.9)
    third = [a for a in actions if isinstance(a, Expand)]
    assert {a.priority for a in third} == {-SPECULATION_BAND}
    moved = {p.priority: set(p.expansions) for p in actions if isinstance(p, SetPriority)}
    assert moved == {-SPECULATION_BAND - 1: {a.expansion_id for a in first},
                     -SPECULATION_BAND - 2: {a.expansion_id for a in second}}


def test_the_oldest_first_ablation_gives_every_speculative_row_one_priority():
    search = Search(preset_config("ep", beam_size=8, beam_width=4, seed=1, rank_speculation=False))
    expands = [a for a in search.start(0.0) if isinstance(a, Expand)]
    priorities = set()
    for handle, e in enumerate(expands[:3]):
        verify = [a for a in search.on(StepFinished(e.expansion_id, 100 + handle, f"s{handle}", 3, (0,), False, 0.0))
                  if isinstance(a, Verify)][0]
        actions = search.on(ScoresArrived(verify.candidate, (0.3 * (handle + 1),), None, 1.0))
        priorities |= {a.priority for a in actions if isinstance(a, (Expand, SetPriority))}
    assert priorities == {-SPECULATION_BAND}
