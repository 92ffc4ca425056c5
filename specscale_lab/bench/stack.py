"""The serving stack a benchmark runs on: the real models (`Pipeline`) or the simulator (`Simulation`).

Every `specscale bench` sub-command drives a stack through this one surface, so `specscale bench <name>
--backend sim` and `specscale simulate <name>` run the very code of a real run (docs/simulator.md):
`RealStack` serves the bundled toy problems on checkpoints and the wall clock; `SimulatedStack` serves the
simulator's problems on the simulated models and the virtual clock. What differs between the two is here
and only here: where the problems come from, how a question becomes a request, what "waiting" means for
an open-loop benchmark (sleep or advance the virtual clock), and what the run record says about the models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

import time

from specscale.config import SearchConfig
from specscale.engine.engine import Engine
from specscale.pipeline import Pipeline
from specscale.search.runtime import SearchRequest, SearchRuntime
from specscale.sim.simulation import Simulation
from specscale_lab.tasks.toy import toy_problems
from specscale.verify.prm import Verifier

PROBLEM_SET_SEED = 0  # every sub-command draws its problems from the same held-out set


class BenchStack(Protocol):
    """What a benchmark needs from the models it serves (`RealStack`, `SimulatedStack`)."""

    engine: Engine  # the generator engine (its block manager, scheduler and tokenizer are reported)
    verifier: Verifier
    lv_threshold_tokens: int
    clock: Callable[[], float]  # seconds: wall on real models, simulated on the simulator
    warms_up: bool  # whether a short run must precede timed ones (kernels, allocator, caches)
    difficulty_unit: str  # what `difficulty` counts

    def runtime(self, max_concurrency: int, **options) -> SearchRuntime: ...
    def backends(self) -> tuple: ...
    def problems(self, count: int) -> list: ...
    def request(self, problem, config: SearchConfig, request_id: str | None = None) -> SearchRequest: ...
    def difficulty(self, problem) -> int: ...
    def wait_until(self, until: float) -> None: ...  # until clock() >= until
    def describe(self) -> dict: ...
    def close(self) -> None: ...


class RealStack:
    """A `Pipeline` on checkpoints, serving the toy task's held-out problems on the wall clock."""

    warms_up = True
    difficulty_unit = "events"

    def __init__(self, pipeline: Pipeline):
        self.pipeline, self.engine, self.verifier = pipeline, pipeline.engine, pipeline.verifier
        self.lv_threshold_tokens = pipeline.lv_threshold_tokens
        self.clock = pipeline.clock

    def runtime(self, max_concurrency: int, **options) -> SearchRuntime:
        return self.pipeline.runtime(max_concurrency, **options)

    def backends(self) -> tuple:
        return self.pipeline.backends()

    def problems(self, count: int) -> list:
        return toy_problems("test", count, seed=PROBLEM_SET_SEED)

    def request(self, problem, config: SearchConfig, request_id: str | None = None) -> SearchRequest:
        return self.pipeline.request(problem.question, config, request_id)

    def difficulty(self, problem) -> int:
        return len(problem.ops)  # events in the toy story

    def wait_until(self, until: float) -> None:
        time.sleep(max(until - self.clock(), 0.0))

    def describe(self) -> dict:
        generator, prm = self.pipeline.config.generator, self.pipeline.config.prm
        return {
            "backend": "real",
            "models": {"generator": str(Path(generator).resolve()), "prm": str(Path(prm).resolve()),
                       "generator_dtype": str(self.engine.runner_dtype).removeprefix("torch."),
                       "prm_dtype": str(self.verifier.engine.runner_dtype).removeprefix("torch.")},
            "lv_threshold_tokens": self.lv_threshold_tokens,
            "kv_blocks": self.engine.block_manager.num_blocks,
            "spare_rows": self.engine.scheduler.spare_rows,
            "kernels": self.pipeline.kernels(),
        }

    def close(self) -> None:
        self.pipeline.close()


class SimulatedStack:
    """A `Simulation`: the simulator's problems on simulated models and the virtual clock."""

    warms_up = False  # nothing to build or warm: the simulated forward passes cost no host setup
    difficulty_unit = "level"

    def __init__(self, simulation: Simulation, lv_threshold_tokens: int | None = None):
        self.simulation, self.engine, self.verifier = simulation, simulation.engine, simulation.verifier
        self.lv_threshold_tokens = lv_threshold_tokens or simulation.lv_threshold()
        self.clock = simulation.clock

    def runtime(self, max_concurrency: int, **options) -> SearchRuntime:
        options.setdefault("lv_threshold_tokens", self.lv_threshold_tokens)
        return self.simulation.runtime(max_concurrency, **options)

    def backends(self) -> tuple:
        return self.simulation.backends()

    def problems(self, count: int) -> list:
        return self.simulation.problems(count)

    def request(self, problem, config: SearchConfig, request_id: str | None = None) -> SearchRequest:
        return self.simulation.request(problem, config, request_id)

    def difficulty(self, problem) -> int:
        return problem.level

    def wait_until(self, until: float) -> None:
        self.simulation.clock.advance_to(until)

    def describe(self) -> dict:
        sim = self.simulation
        return {
            "backend": "sim",
            "simulation": {k: v for k, v in asdict(sim.config).items() if k != "workload"},
            "hardware": asdict(sim.hardware),
            "models": {"generator": sim.generator_profile.name, "prm": sim.prm_profile.name,
                       "prm_format": sim.prm_format},
            "workload": sim.workload.to_json(),
            "lv_threshold_tokens": self.lv_threshold_tokens,
            "kv_blocks": self.engine.block_manager.num_blocks,
            "prm_kv_blocks": self.verifier.engine.block_manager.num_blocks,
            "spare_rows": self.engine.scheduler.spare_rows,
        }

    def close(self) -> None:
        self.simulation.close()
