"""Stack: the composition root of a running system — a generator engine, a PRM verifier, the clock they
run on and the device properties resolved for them, handed out once to whatever drives searches.

Two stacks build one: `pipeline.py` `Pipeline` on real checkpoints (wall clock) and `sim/simulation.py`
`Simulation` on simulated models (virtual clock, docs/simulator.md). Each resolves the device properties
through the same one function per property, before it builds its engines:

- the speculative row budget: `costmodel/row_budget.py` `resolve_row_budget` (the device's cost model);
- the lazy-verification threshold: `verify/profile.py` `resolve_lv_threshold` (the PRM's profiled knee).

The CLI, the server (`server/search_stack.py`) and the benchmarks take runtimes from a stack
(`runtime(...)`), so whatever drives a runtime runs on either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specscale.answers import read_answers
from specscale.engine.engine import Engine
from specscale.engine.generator_backend import EngineBackend
from specscale.runtime.backend import GeneratorBackend, VerifierBackend
from specscale.runtime.runtime import SearchRuntime
from specscale.verify.prm import Verifier


@dataclass(frozen=True)
class DeviceProperties:
    """What a stack resolved for its device. spare_rows None: speculative rows are unbounded (no cost model)."""

    lv_threshold_tokens: int
    spare_rows: int | None


class Stack:
    """engine: the generator's; verifier: the PRM's (in this process or served elsewhere); clock: what the
    runtime reads time from; max_concurrency: a runtime's default number of searches in flight."""

    def __init__(self, engine: Engine, verifier: VerifierBackend, clock: Callable[[], float],
                 device: DeviceProperties, max_concurrency: int):
        self.engine = engine
        self.verifier = verifier
        self.clock = clock
        self.device = device
        self.max_concurrency = max_concurrency

    @property
    def lv_threshold_tokens(self) -> int:
        return self.device.lv_threshold_tokens

    @property
    def spare_rows(self) -> int | None:
        return self.device.spare_rows

    def local_engines(self) -> list[Engine]:
        """The engines this process runs: the generator's, and the PRM's unless it is served elsewhere."""
        return [self.engine] + ([self.verifier.engine] if isinstance(self.verifier, Verifier) else [])

    def backends(self) -> tuple[GeneratorBackend, VerifierBackend]:
        """The generator engine and the verifier as the runtime sees them (a fresh id mapping each time)."""
        return EngineBackend(self.engine), self.verifier

    def runtime(self, max_concurrency: int | None = None, generator: GeneratorBackend | None = None,
                verifier: VerifierBackend | None = None, lv_threshold_tokens: int | None = None,
                **options) -> SearchRuntime:
        """A runtime with fresh metrics over this stack's backends (or instrumented stand-ins for them) and
        clock; lv_threshold_tokens None takes the stack's (a sweep sets its own); options: `SearchRuntime`'s
        callbacks, keep_finished and read_answers (default: `answers.read_answers`, math-verify grouping)."""
        own_generator, own_verifier = self.backends()
        options.setdefault("read_answers", read_answers)
        return SearchRuntime(generator or own_generator, verifier or own_verifier, clock=self.clock,
                             max_concurrency=max_concurrency or self.max_concurrency,
                             lv_threshold_tokens=self.lv_threshold_tokens if lv_threshold_tokens is None else lv_threshold_tokens,
                             **options)

    def close(self) -> None:
        self.verifier.close()
