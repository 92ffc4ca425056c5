"""Simulation: a generator engine and a PRM verifier on simulated models, one device, one virtual clock.

"One engine, two clocks": the `Engine` (scheduler, block manager, sampler, stop detection), the `Verifier`
(PRM input formats, step-prefix reuse, waves) and whatever drives them (`SearchRuntime`, `Search`) are the
real ones; only the two models' forward passes (`SimulatedRunner` + the workload's `SyntheticGenerator` /
`SyntheticPRM`) and the clock are simulated. Both runners advance the same clock: the device is time-shared.
KV pools are sized from the memory the hardware has left after both models' weights (`cost.kv_capacity`).
A `Simulation` is a `stack.py` `Stack`, described by `SimulationConfig` (`composition.py` `build_stack`): its
device properties come from the resolver `Pipeline` calls too (`device_resolver.py`), with the simulated
PRM's knee on the cost model as what `specscale profile-prm` would measure.
"""

from __future__ import annotations

from dataclasses import dataclass

from specscale.config import EngineConfig, SearchConfig
from specscale.costmodel.cost import CostModel, RooflineCostModel, kv_capacity
from specscale.costmodel.hardware import HardwareProfile
from specscale.costmodel.model_profile import ModelProfile
from specscale.device_resolver import resolve_device_properties
from specscale.engine.engine import Engine
from specscale.runtime.device_properties import DeviceProperties
from specscale.runtime.runtime import SearchRequest
from specscale.sim.clock import VirtualClock
from specscale.sim.problems import Problem, make_problems
from specscale.sim.runner import SimulatedRunner
from specscale.sim.synthetic_generator import SyntheticGenerator
from specscale.sim.synthetic_prm import FORMAT_TEMPLATES, SyntheticPRM
from specscale.sim.tokenizer import SyntheticTokenizer
from specscale.sim.workload import WorkloadParams, preset
from specscale.stack import Stack
from specscale.verify.formats import format_name_for
from specscale.verify.prm import PRM_MAX_BATCHED_TOKENS, PRM_MAX_SEQS, Verifier, VerifierConfig


@dataclass(frozen=True)
class SimulationConfig:
    """hardware / generator / prm: bundled names (`bundled_hardware`, `bundled_models`) or paths.
    workload None takes `workload.preset(dataset, generator, prm)`. prm_format None follows the PRM's
    architecture. generator_kv_blocks / prm_kv_blocks None size the pools from memory (prm_kv_share of
    the KV memory goes to the PRM). spare_rows None takes the device's speculative row budget
    (costmodel/row_budget.py); lv_threshold_tokens None the simulated PRM's knee on the cost model. The engine
    settings match `Pipeline`'s."""

    hardware: str = "a100-80gb"
    generator: str = "qwen2.5-7b-instruct"
    prm: str = "qwen2.5-math-prm-7b"
    dataset: str = "math500"
    workload: WorkloadParams | None = None
    prm_format: str | None = None
    block_size: int = 16
    prm_kv_share: float = 0.3
    generator_kv_blocks: int | None = None
    prm_kv_blocks: int | None = None
    max_num_seqs: int = 512
    spare_rows: int | None = None
    lv_threshold_tokens: int | None = None
    max_concurrency: int = 32
    seed: int = 0

    def build(self) -> Simulation:
        """The stack this describes (`composition.py` `build_stack`)."""
        return Simulation(self)


class Simulation(Stack):
    clock: VirtualClock  # the stack's clock is the simulation's virtual one (advanced by both runners)
    verifier: Verifier  # the simulated PRM runs in this process
    engine: Engine  # the simulated generator runs on our engine
    tokenizer: SyntheticTokenizer

    def __init__(self, config: SimulationConfig = SimulationConfig(), cost_model: CostModel | None = None):
        self.config = config
        self.clock = VirtualClock()
        self.hardware = HardwareProfile.load(config.hardware)
        self.cost_model = cost_model or RooflineCostModel(self.hardware)
        self.generator_profile = ModelProfile.load(config.generator)
        self.prm_profile = ModelProfile.load(config.prm)
        self.workload = config.workload or preset(config.dataset, self.generator_profile.name, self.prm_profile.name)
        self.prm_format = config.prm_format or format_name_for({"architectures": [self.prm_profile.architecture]})
        self.tokenizer = SyntheticTokenizer("chatml", levels=self.workload.levels)
        device = self._device_properties()
        engine = self._generator_engine(device.spare_rows)
        super().__init__(engine, self._verifier(), self.clock, device, config.max_concurrency, self.tokenizer,
                         engine.max_model_len)

    def _device_properties(self) -> DeviceProperties:
        """Through the resolver the real stack calls too (device_resolver.py); nothing is measured here."""
        c = self.config
        return resolve_device_properties(self.cost_model, self.generator_profile, lambda: self.prm_profile,
                                         c.max_num_seqs, c.lv_threshold_tokens, c.spare_rows)

    def _kv_blocks(self) -> tuple[int, int]:
        c = self.config
        capacity = kv_capacity(self.hardware, self.generator_profile, self.prm_profile, c.block_size, c.prm_kv_share)
        return c.generator_kv_blocks or capacity.generator_blocks, c.prm_kv_blocks or capacity.prm_blocks

    def _generator_engine(self, spare_rows: int | None) -> Engine:
        c = self.config
        head = SyntheticGenerator(self.workload, self.tokenizer, c.seed)
        runner = SimulatedRunner(self.generator_profile, head, self.cost_model, self.clock, "generator",
                                 self._kv_blocks()[0], c.block_size, self.tokenizer.vocab_size,
                                 live_sequences=lambda: engine.num_live_sequences)
        config = EngineConfig(model=f"sim:{c.generator}", block_size=c.block_size, max_num_seqs=c.max_num_seqs,
                              spare_rows=spare_rows, seed=c.seed)
        engine = Engine(config, runner=runner, tokenizer=self.tokenizer)
        return engine

    def _verifier(self) -> Verifier:
        c = self.config
        tokenizer = SyntheticTokenizer(FORMAT_TEMPLATES[self.prm_format], levels=self.workload.levels)
        head = SyntheticPRM(self.workload.prm, tokenizer, self.prm_format, c.seed)
        runner = SimulatedRunner(self.prm_profile, head, self.cost_model, self.clock, "prm", self._kv_blocks()[1],
                                 c.block_size, tokenizer.vocab_size, live_sequences=lambda: engine.num_live_sequences)
        config = EngineConfig(model=f"sim:{c.prm}", block_size=c.block_size, max_num_batched_tokens=PRM_MAX_BATCHED_TOKENS,
                              max_num_seqs=PRM_MAX_SEQS, seed=c.seed)
        engine = Engine(config, runner=runner, tokenizer=tokenizer)
        return Verifier(VerifierConfig(config, format=self.prm_format), engine=engine)

    # ---- what a run needs ------------------------------------------------------------------------------
    def problems(self, count: int) -> list[Problem]:
        return make_problems(self.workload, self.tokenizer, count, self.config.seed)

    def request(self, problem: Problem, config: SearchConfig, request_id: str | None = None) -> SearchRequest:
        return SearchRequest(problem.question, list(problem.prompt_ids), config, request_id)
