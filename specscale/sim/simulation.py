"""Simulation: a generator engine and a PRM verifier on simulated models, one device, one virtual clock.

"One engine, two clocks": the `Engine` (scheduler, block manager, sampler, stop detection), the `Verifier`
(PRM input formats, step-prefix reuse, waves) and whatever drives them (`SearchRuntime`, `Search`) are the
real ones; only the two models' forward passes (`SimulatedRunner` + the workload's `SyntheticGenerator` /
`SyntheticPRM`) and the clock are simulated. Both runners advance the same clock: the device is time-shared.
KV pools are sized from the memory the hardware has left after both models' weights (`cost.kv_capacity`).
"""

from __future__ import annotations

from dataclasses import dataclass

from specscale.answers import read_answers
from specscale.config import EngineConfig, SearchConfig
from specscale.engine.engine import Engine
from specscale.search.backend import GeneratorBackend, VerifierBackend
from specscale.search.engine_backend import EngineBackend
from specscale.sim.row_budget import speculative_row_budget
from specscale.search.runtime import SearchRequest, SearchRuntime
from specscale.sim.clock import VirtualClock
from specscale.sim.cost import CostModel, IterationWork, RooflineCostModel, kv_capacity
from specscale.sim.hardware import HardwareProfile
from specscale.sim.model_profile import ModelProfile
from specscale.sim.problems import Problem, make_problems
from specscale.sim.runner import SimulatedRunner
from specscale.sim.synthetic_generator import SyntheticGenerator
from specscale.sim.synthetic_prm import FORMAT_TEMPLATES, SyntheticPRM
from specscale.sim.tokenizer import SyntheticTokenizer
from specscale.sim.workload import WorkloadParams, preset
from specscale.verify.formats import format_name_for
from specscale.verify.prm import Verifier, VerifierConfig
from specscale.verify.profile import DEFAULT_BATCH_TOKENS, ProfilePoint, knee, sequence_sizes

PROFILE_CONTEXT_TOKENS, PROFILE_STEP_TOKENS = 512, 128  # the shape `specscale profile-prm` measures


@dataclass(frozen=True)
class SimulationConfig:
    """hardware / generator / prm: bundled names (`bundled_hardware`, `bundled_models`) or paths.
    workload None takes `workload.preset(dataset, generator, prm)`. prm_format None follows the PRM's
    architecture. generator_kv_blocks / prm_kv_blocks None size the pools from memory (prm_kv_share of
    the KV memory goes to the PRM). spare_rows None takes the device's speculative row budget
    (sim/row_budget.py). The engine settings match `Pipeline`'s."""

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
    seed: int = 0


class Simulation:
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
        self.engine = self._generator_engine()
        self.verifier = self._verifier()

    def _kv_blocks(self) -> tuple[int, int]:
        c = self.config
        capacity = kv_capacity(self.hardware, self.generator_profile, self.prm_profile, c.block_size, c.prm_kv_share)
        return c.generator_kv_blocks or capacity.generator_blocks, c.prm_kv_blocks or capacity.prm_blocks

    def _generator_engine(self) -> Engine:
        c = self.config
        head = SyntheticGenerator(self.workload, self.tokenizer, c.seed)
        runner = SimulatedRunner(self.generator_profile, head, self.cost_model, self.clock, "generator",
                                 self._kv_blocks()[0], c.block_size, self.tokenizer.vocab_size,
                                 live_sequences=lambda: engine.num_live_sequences)
        config = EngineConfig(model=f"sim:{c.generator}", block_size=c.block_size, max_num_seqs=c.max_num_seqs,
                              spare_rows=self.spare_rows(), seed=c.seed)
        engine = Engine(config, runner=runner, tokenizer=self.tokenizer)
        return engine

    def _verifier(self) -> Verifier:
        c = self.config
        tokenizer = SyntheticTokenizer(FORMAT_TEMPLATES[self.prm_format], levels=self.workload.levels)
        head = SyntheticPRM(self.workload.prm, tokenizer, self.prm_format, c.seed)
        runner = SimulatedRunner(self.prm_profile, head, self.cost_model, self.clock, "prm", self._kv_blocks()[1],
                                 c.block_size, tokenizer.vocab_size, live_sequences=lambda: engine.num_live_sequences)
        config = EngineConfig(model=f"sim:{c.prm}", block_size=c.block_size, max_num_batched_tokens=8192,
                              max_num_seqs=1024, seed=c.seed)
        engine = Engine(config, runner=runner, tokenizer=tokenizer)
        return Verifier(VerifierConfig(config, format=self.prm_format), engine=engine)

    # ---- what a run needs ------------------------------------------------------------------------------
    def problems(self, count: int) -> list[Problem]:
        return make_problems(self.workload, self.tokenizer, count, self.config.seed)

    def request(self, problem: Problem, config: SearchConfig, request_id: str | None = None) -> SearchRequest:
        return SearchRequest(problem.question, list(problem.prompt_ids), config, request_id)

    def backends(self) -> tuple[GeneratorBackend, VerifierBackend]:
        """The simulated generator engine and verifier as the runtime sees them (a fresh id mapping each time)."""
        return EngineBackend(self.engine), self.verifier

    def runtime(self, max_concurrency: int = 32, generator: GeneratorBackend | None = None,
                verifier: VerifierBackend | None = None, lv_threshold_tokens: int | None = None,
                **options) -> SearchRuntime:
        """A SearchRuntime on the simulated backends (or instrumented stand-ins for them) and the virtual
        clock; the LV threshold defaults to the simulated PRM's profiled knee. options: `SearchRuntime`'s
        callbacks and keep_finished. Same signature as `Pipeline.runtime`."""
        own_generator, own_verifier = self.backends()
        options.setdefault("read_answers", read_answers)
        return SearchRuntime(generator or own_generator, verifier or own_verifier, clock=self.clock,
                             max_concurrency=max_concurrency,
                             lv_threshold_tokens=lv_threshold_tokens or self.lv_threshold(), **options)

    def spare_rows(self) -> int:
        """The speculative row budget: the config's, else the simulated device's (sim/row_budget.py)."""
        if self.config.spare_rows is not None:
            return self.config.spare_rows
        return speculative_row_budget(self.cost_model, self.generator_profile, self.config.max_num_seqs)

    def lv_threshold(self) -> int:
        """`specscale profile-prm`'s knee, computed on the cost model for the batches it measures."""
        points = []
        for batch in DEFAULT_BATCH_TOKENS:
            sizes = sequence_sizes(batch, PROFILE_STEP_TOKENS)
            work = IterationWork((), tuple((n, PROFILE_CONTEXT_TOKENS) for n in sizes), len(sizes))
            points.append(ProfilePoint(batch, (self.cost_model.iteration_seconds(self.prm_profile, work, "prm"),)))
        return knee(points)

    def close(self) -> None:
        self.verifier.close()
