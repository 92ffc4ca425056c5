"""Testbed: what a benchmark runs on — a `specscale/stack.py` `Stack` (built by `specscale/composition.py`
`build_stack`: the real models' `Pipeline` or the simulator's `Simulation`) plus the workload it serves.

Every `specscale bench` sub-command drives a testbed through this one surface, so `specscale bench <name>
--backend sim` and `specscale simulate <name>` run the very code of a real run (docs/simulator.md). The
engines, the verifier, the clock and the device properties (LV threshold, speculative row budget) are the
`Stack`'s, resolved there once; a `Testbed` adds only what differs between a real and a simulated run:
where the problems come from, how a question becomes a request, what "waiting" means for an open-loop
benchmark (sleep or advance the virtual clock), and what the run record says about the models.
`RealTestbed` serves the bundled toy problems on checkpoints and the wall clock (on our engine, or on vLLM's:
`--backend vllm`, a `vllm_backend/stack.py` `VllmStack`); `SimulatedTestbed` serves the simulator's problems
on the simulated models and the virtual clock.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from specscale.config import SearchConfig
from specscale.engine.engine import Engine
from specscale.pipeline import Pipeline, PipelineConfig
from specscale.runtime.backend import GeneratorBackend, VerifierBackend
from specscale.runtime.device_properties import DeviceProperties
from specscale.runtime.runtime import SearchRequest, SearchRuntime
from specscale.sim.simulation import Simulation
from specscale.stack import Stack
from specscale.tokenizer import ChatTokenizer
from specscale.verify.prm import Verifier
from specscale.vllm_backend.stack import VllmStack
from specscale_lab.tasks.toy import toy_problems

PROBLEM_SET_SEED = 0  # every sub-command draws its problems from the same held-out set


class Testbed(ABC):
    """A `Stack` and the workload served on it. The engines, clock and device properties are the stack's."""

    warms_up: bool  # whether a short run must precede timed ones (kernels, allocator, caches)
    difficulty_unit: str  # what `difficulty` counts

    def __init__(self, stack: Stack):
        self.stack = stack

    # ---- the composition root's, as it resolved them -------------------------------------------------
    @property
    def engine(self) -> Engine | None:
        """The generator engine when it is ours (None on vLLM)."""
        return self.stack.engine

    @property
    def tokenizer(self) -> ChatTokenizer:
        return self.stack.tokenizer

    @property
    def verifier(self) -> VerifierBackend:
        return self.stack.verifier

    @property
    def clock(self) -> Callable[[], float]:
        """Seconds: wall on real models, simulated on the simulator."""
        return self.stack.clock

    @property
    def device(self) -> DeviceProperties:
        """The LV threshold and speculative row budget the stack resolved."""
        return self.stack.device

    def runtime(self, max_concurrency: int | None = None, **options) -> SearchRuntime:
        return self.stack.runtime(max_concurrency, **options)

    def local_engines(self) -> list[Engine]:
        return self.stack.local_engines()

    def forget_cached_prefixes(self) -> None:
        self.stack.forget_cached_prefixes()

    def backends(self) -> tuple[GeneratorBackend, VerifierBackend]:
        return self.stack.backends()

    def close(self) -> None:
        self.stack.close()

    def describe(self) -> dict:
        """What the run record says about the models and the device properties."""
        return {**self.describe_models(), "lv_threshold_tokens": self.device.lv_threshold_tokens,
                "kv_blocks": self.stack.generator_kv_blocks(), "spare_rows": self.device.spare_rows}

    # ---- the workload: each testbed's own ------------------------------------------------------------
    @abstractmethod
    def problems(self, count: int) -> list: ...

    @abstractmethod
    def request(self, problem, config: SearchConfig, request_id: str | None = None) -> SearchRequest: ...

    @abstractmethod
    def difficulty(self, problem) -> int: ...

    @abstractmethod
    def wait_until(self, until: float) -> None:
        """Until clock() >= until."""

    @abstractmethod
    def describe_models(self) -> dict: ...


class RealTestbed(Testbed):
    """Checkpoints — a `Pipeline` (our engine) or a `VllmStack` (vLLM's) — serving the toy task's held-out
    problems on the wall clock."""

    warms_up = True
    difficulty_unit = "events"

    def __init__(self, pipeline: Pipeline | VllmStack):
        super().__init__(pipeline)
        self.pipeline = pipeline

    @property
    def config(self) -> PipelineConfig:
        """The models and how they are served (a `VllmStack`'s within its vLLM description)."""
        return self.pipeline.config.pipeline if isinstance(self.pipeline, VllmStack) else self.pipeline.config

    def problems(self, count: int) -> list:
        return toy_problems("test", count, seed=PROBLEM_SET_SEED)

    def request(self, problem, config: SearchConfig, request_id: str | None = None) -> SearchRequest:
        return self.pipeline.request(problem.question, config, request_id)

    def difficulty(self, problem) -> int:
        return len(problem.ops)  # events in the toy story

    def wait_until(self, until: float) -> None:
        time.sleep(max(until - self.clock(), 0.0))

    def describe_models(self) -> dict:
        models = {"generator": str(Path(self.config.generator).resolve()), "prm": str(Path(self.config.prm).resolve())}
        if self.engine is not None:  # vLLM's dtype is its own (its log says it)
            models["generator_dtype"] = _dtype(self.engine)
        if isinstance(self.verifier, Verifier):  # a PRM served in this process (a remote one reports its own)
            models["prm_dtype"] = _dtype(self.verifier.engine)
        return {"backend": "real", "models": models, "kernels": self.pipeline.kernels(), **self.vllm_record()}

    def vllm_record(self) -> dict:
        """On vLLM: the backend of each model and the engine arguments given (nothing on our engine)."""
        if not isinstance(self.pipeline, VllmStack):
            return {}
        return {"backend": "vllm", "vllm": {"backends": self.pipeline.describe(), "vllm_args": self.pipeline.config.vllm_args}}


class SimulatedTestbed(Testbed):
    """A `Simulation`: the simulator's problems on simulated models and the virtual clock."""

    warms_up = False  # nothing to build or warm: the simulated forward passes cost no host setup
    difficulty_unit = "level"

    def __init__(self, simulation: Simulation):
        super().__init__(simulation)
        self.simulation = simulation

    def problems(self, count: int) -> list:
        return self.simulation.problems(count)

    def request(self, problem, config: SearchConfig, request_id: str | None = None) -> SearchRequest:
        return self.simulation.request(problem, config, request_id)

    def difficulty(self, problem) -> int:
        return problem.level

    def wait_until(self, until: float) -> None:
        self.simulation.clock.advance_to(until)

    def describe_models(self) -> dict:
        sim = self.simulation
        return {
            "backend": "sim",
            "simulation": {k: v for k, v in asdict(sim.config).items() if k != "workload"},
            "hardware": asdict(sim.hardware),
            "models": {"generator": sim.generator_profile.name, "prm": sim.prm_profile.name,
                       "prm_format": sim.prm_format},
            "workload": sim.workload.to_json(),
            "prm_kv_blocks": sim.verifier.engine.block_manager.num_blocks,
        }


def _dtype(engine: Engine) -> str:
    return str(engine.runner_dtype).removeprefix("torch.")
