"""Stack: a running system — a generator (its tokenizer, its context length and, when it is ours, its engine), a
PRM verifier, the clock they run on and the device properties resolved for them, handed out once to whatever
drives searches.

`composition.py` `build_stack` builds one from a description, one builder per backend kind: `pipeline.py`
`Pipeline` on real checkpoints (wall clock; its PRM in this process or served elsewhere) and
`sim/simulation.py` `Simulation` on simulated models (virtual clock, docs/simulator.md). Each resolves its
`DeviceProperties` once, through `device_resolver.py` `resolve_device_properties`, before it builds its
engines; the stack hands the value down (the row budget to its generator engine, the LV threshold to every
runtime it builds).

The CLI, the server (`server/serving_process.py`) and the benchmarks take runtimes from a stack
(`runtime(...)`), so whatever drives a runtime runs on either. They read the generator's tokenizer and context
length from the stack itself (`tokenizer`, `context_tokens`), never through an engine: a stack whose generator
runs on vLLM (`vllm_backend/stack.py`) has no engine of ours (`engine` None, `local_engines()` without it).
"""

from __future__ import annotations

from collections.abc import Callable

from specscale.answers import read_answers
from specscale.engine.engine import Engine
from specscale.engine.generator_backend import EngineBackend
from specscale.runtime.backend import GeneratorBackend, VerifierBackend
from specscale.runtime.device_properties import DeviceProperties
from specscale.runtime.runtime import SearchRuntime
from specscale.tokenizer import ChatTokenizer
from specscale.verify.prm import Verifier


class Stack:
    """engine: the generator's when it runs on our engine, else None; tokenizer / context_tokens: the
    generator's (what a prompt is encoded with, how long a sequence may grow); verifier: the PRM's (in this
    process or served elsewhere); clock: what the runtime reads time from; max_concurrency: a runtime's default
    number of searches in flight."""

    def __init__(self, engine: Engine | None, verifier: VerifierBackend, clock: Callable[[], float],
                 device: DeviceProperties, max_concurrency: int, tokenizer: ChatTokenizer, context_tokens: int):
        self.engine = engine
        self.tokenizer = tokenizer
        self.context_tokens = context_tokens
        self.verifier = verifier
        self.clock = clock
        self.device = device
        self.max_concurrency = max_concurrency

    def local_engines(self) -> list[Engine]:
        """Our engines this process runs: the generator's unless it runs elsewhere (vLLM), the PRM's unless it
        is served elsewhere."""
        prm = self.verifier.engine if isinstance(self.verifier, Verifier) else None
        return [engine for engine in (self.engine, prm) if engine is not None]

    def forget_cached_prefixes(self) -> None:
        """Free KV blocks out of the prefix caches of this process's engines, so that the next run computes its
        prompts' KV as the first one did (a benchmark's runs start alike)."""
        for engine in self.local_engines():
            engine.forget_free_prefixes()

    def generator_kv_blocks(self) -> int:
        """The generator's KV pool, in blocks (what a run record and `bench scaling` report)."""
        if self.engine is None:
            raise NotImplementedError(f"{type(self).__name__} has no engine of ours: it overrides generator_kv_blocks()")
        return self.engine.block_manager.num_blocks

    def backends(self) -> tuple[GeneratorBackend, VerifierBackend]:
        """The generator engine and the verifier as the runtime sees them (a fresh id mapping each time); a
        stack without our engine gives its own generator backend."""
        if self.engine is None:
            raise NotImplementedError(f"{type(self).__name__} has no engine of ours: it overrides backends()")
        return EngineBackend(self.engine), self.verifier

    def runtime(self, max_concurrency: int | None = None, generator: GeneratorBackend | None = None,
                verifier: VerifierBackend | None = None, device: DeviceProperties | None = None,
                **options) -> SearchRuntime:
        """A runtime with fresh metrics over this stack's backends (or instrumented stand-ins for them) and
        clock, with the stack's device properties (a sweep of the LV threshold hands another value);
        options: `SearchRuntime`'s callbacks, keep_finished and read_answers (default: `answers.read_answers`,
        math-verify grouping)."""
        own_generator, own_verifier = self.backends()
        options.setdefault("read_answers", read_answers)
        return SearchRuntime(generator or own_generator, verifier or own_verifier, device or self.device,
                             clock=self.clock, max_concurrency=max_concurrency or self.max_concurrency, **options)

    def close(self) -> None:
        self.verifier.close()
