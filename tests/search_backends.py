"""The backends the search and runtime suite runs on, behind one fixture (`search_backend` in conftest):

- "scripted": `tests/scripted_generator.py` + `tests/scripted_verifier.py` on a virtual clock (exact, instant);
- "toy": the real `Engine` and `Verifier` on the bundled toy models (wall clock);
- "simulated": the real `Engine` and `Verifier` on the simulator's runners (docs/simulator.md), virtual clock.

Each gives fresh runtimes and requests with its own prompts; `SMALL` search settings keep the real
backends' runs short.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scripted_generator import ScriptedGenerator, seeded_step
from scripted_verifier import ScriptedVerifier
from specscale.answers import read_answers
from specscale.config import SearchConfig
from specscale.pipeline import Pipeline, PipelineConfig
from specscale.runtime.device_properties import DeviceProperties
from specscale.runtime.runtime import SearchRequest, SearchRuntime
from specscale.sim.clock import VirtualClock
from specscale.sim.simulation import Simulation, SimulationConfig
from specscale_lab.tasks.toy import toy_problems

PROMPT = (1, 2, 3, 4, 5)
SCRIPTED_LV_THRESHOLD = 40
SMALL = dict(beam_size=4, beam_width=2, max_rounds=4, max_step_tokens=48)


@dataclass
class SearchBackend:
    name: str
    runtime: Callable[..., SearchRuntime]  # (max_concurrency=..., callbacks) -> a fresh runtime
    request: Callable[[int, SearchConfig, str | None], SearchRequest]  # (problem index, config, id)
    release: Callable[[], None] = lambda: None  # after a test: drop the PRM's cached prefixes


def scripted_runtime(max_concurrency: int = 32, step_fn=seeded_step, perfect_rate: float = 0.0,
                     score_levels: int = 10_000, spare_rows: int | None = None, **options) -> SearchRuntime:
    clock = VirtualClock()
    verifier = ScriptedVerifier(clock, perfect_rate=perfect_rate, score_levels=score_levels)
    generator = ScriptedGenerator(clock, step_fn, spare_rows=spare_rows)
    return SearchRuntime(generator, verifier, DeviceProperties(SCRIPTED_LV_THRESHOLD, spare_rows),
                         clock=clock, max_concurrency=max_concurrency, read_answers=read_answers, **options)


def scripted_request(index: int, config: SearchConfig, request_id: str | None = None) -> SearchRequest:
    return SearchRequest(f"question {index}", list(PROMPT) + [index], config, request_id)


def scripted_backend() -> SearchBackend:
    return SearchBackend("scripted", scripted_runtime, scripted_request)


def toy_backend() -> tuple[SearchBackend, Pipeline]:
    pipeline = Pipeline(PipelineConfig(lv_threshold_tokens=512, generator_kv_gb=0.25, prm_kv_gb=0.25))
    problems = toy_problems("test", 16, seed=3)

    def request(index: int, config: SearchConfig, request_id: str | None = None) -> SearchRequest:
        return pipeline.request(problems[index].question, config, request_id)

    return SearchBackend("toy", pipeline.runtime, request, pipeline.verifier.clear), pipeline


def simulated_backend() -> tuple[SearchBackend, Simulation]:
    sim = Simulation(SimulationConfig(seed=0))
    problems = sim.problems(16)

    def request(index: int, config: SearchConfig, request_id: str | None = None) -> SearchRequest:
        return sim.request(problems[index], config, request_id)

    return SearchBackend("simulated", sim.runtime, request, sim.verifier.clear), sim
