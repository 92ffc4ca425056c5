"""Pipeline: the generator engine and the PRM verifier built from one config, and search runtimes over them.

The CLI (`specscale solve`, `specscale bench`, `specscale eval`) and the server build their serving stack
here, so they agree on defaults: the bundled toy models, served in their checkpoint dtype (bf16), on CPU.
`sim/simulation.py` `Simulation` builds the same two backends on simulated models; both hand out
runtimes through `runtime(...)`, so whatever drives a runtime runs on either.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from specscale.answers import read_answers
from specscale.chat_text import render_chat_text
from specscale.config import EngineConfig, SearchConfig
from specscale.defaults import TOY_GENERATOR, TOY_PRM
from specscale.engine.engine import Engine
from specscale.prompts import TOY_GENERATOR_SYSTEM_PROMPT, chat_messages
from specscale.sim.row_budget import checkpoint_row_budget, hardware_profile_for
from specscale.search.backend import GeneratorBackend, VerifierBackend
from specscale.search.engine_backend import EngineBackend
from specscale.search.runtime import SearchRequest, SearchRuntime
from specscale.verify.prm import Verifier, VerifierConfig
from specscale.verify.profile import load_lv_threshold

logger = logging.getLogger(__name__)

# When this PRM and device were never profiled: a 7-8B PRM's prefill on an A100 saturates near
# 2,048 batch tokens (docs/BENCHMARKS.md, the PRM profile).
DEFAULT_LV_THRESHOLD = 2048


@dataclass(frozen=True)
class PipelineConfig:
    """generator / prm: local Hugging Face folders. lv_threshold_tokens None reads the profiler's file
    (`specscale profile-prm`) for this PRM and device, else falls back to 2048. trust_special_tokens:
    special-token text in questions is read as control tokens (default: plain text; chat_text.py)."""

    generator: str = str(TOY_GENERATOR)
    prm: str = str(TOY_PRM)
    generator_dtype: str = "auto"
    prm_dtype: str = "auto"
    device: str = "cpu"
    generator_kv_gb: float = 2.0
    prm_kv_gb: float = 1.0
    max_num_seqs: int = 512
    spare_rows: int | None = None  # speculative rows fill an iteration up to this many; None: the device's
    # budget from its cost model (sim/row_budget.py), unbounded on a device without a profile
    max_concurrency: int = 32
    lv_threshold_tokens: int | None = None
    system_prompt: str = TOY_GENERATOR_SYSTEM_PROMPT
    seed: int = 0
    trust_special_tokens: bool = False
    kernels: str = "auto"  # EngineConfig.kernels of both engines


def build_verifier(config: PipelineConfig) -> Verifier:
    """The PRM verifier of this config (a pipeline's own, or a PRM replica's in disaggregated serving:
    docs/scale-out.md)."""
    return Verifier(VerifierConfig(EngineConfig(
        model=config.prm, dtype=config.prm_dtype, device=config.device, kv_cache_memory_gb=config.prm_kv_gb,
        max_num_batched_tokens=8192, max_num_seqs=1024, seed=config.seed, kernels=config.kernels,
    ), trust_special_tokens=config.trust_special_tokens))


class Pipeline:
    """verifier: a verifier served elsewhere (`scaleout/remote_verifier.py`, docs/scale-out.md), which must
    also carry the PRM's `format` and `max_input_tokens`; None builds the PRM verifier in this process."""

    def __init__(self, config: PipelineConfig = PipelineConfig(), clock=None, verifier: VerifierBackend | None = None):
        self.config = config
        self.engine = Engine(EngineConfig(
            model=config.generator, dtype=config.generator_dtype, device=config.device,
            kv_cache_memory_gb=config.generator_kv_gb, max_num_seqs=config.max_num_seqs, seed=config.seed,
            spare_rows=self._spare_rows(), kernels=config.kernels,
        ))
        self.verifier = verifier or build_verifier(config)
        self.lv_threshold_tokens = self._lv_threshold()
        self.clock = clock or time.perf_counter

    def backends(self) -> tuple[GeneratorBackend, VerifierBackend]:
        """The generator engine and the verifier as the runtime sees them (a fresh id mapping each time)."""
        return EngineBackend(self.engine), self.verifier

    def runtime(self, max_concurrency: int | None = None, generator: GeneratorBackend | None = None,
                verifier: VerifierBackend | None = None, lv_threshold_tokens: int | None = None,
                **options) -> SearchRuntime:
        """A runtime with fresh metrics over this pipeline's backends (or instrumented stand-ins for them);
        lv_threshold_tokens None takes the pipeline's (a sweep sets its own); options: `SearchRuntime`'s
        callbacks and keep_finished."""
        own_generator, own_verifier = self.backends()
        options.setdefault("read_answers", read_answers)
        return SearchRuntime(generator or own_generator, verifier or own_verifier, clock=self.clock,
                             max_concurrency=max_concurrency or self.config.max_concurrency,
                             lv_threshold_tokens=lv_threshold_tokens or self.lv_threshold_tokens, **options)

    def _spare_rows(self) -> int | None:
        """The speculative row budget: the config's, else the device's (sim/row_budget.py)."""
        config = self.config
        if config.spare_rows is not None:
            return config.spare_rows
        name = torch.cuda.get_device_name(config.device) if config.device.startswith("cuda") else None
        hardware = hardware_profile_for(config.device, name)
        if hardware is None:
            logger.warning("no cost profile for %s (%s): speculative rows may fill the batch", config.device, name)
            return None
        return checkpoint_row_budget(config.generator, config.generator_dtype, hardware, config.max_num_seqs)

    def _lv_threshold(self) -> int:
        if self.config.lv_threshold_tokens is not None:
            return self.config.lv_threshold_tokens
        return load_lv_threshold(self.config.prm, self.config.device) or DEFAULT_LV_THRESHOLD

    def kernels(self) -> dict:
        """The machine and the path of every hot path of each model (model/kernel_choice.py), as /health reports it."""
        report = {"generator": self.engine.kernels()}
        if isinstance(self.verifier, Verifier):
            report["prm"] = self.verifier.engine.kernels()
        return report

    def model_memory(self) -> dict:
        """What each model holds (model/memory.py), as /health reports it."""
        memory = {"generator": self.engine.model_memory().as_dict()}
        if isinstance(self.verifier, Verifier):  # a remote PRM's memory is its own replica's to report
            memory["prm"] = self.verifier.engine.model_memory().as_dict()
        return memory

    def prompt_ids(self, question: str) -> list[int]:
        chat = render_chat_text(self.engine.tokenizer, chat_messages(question, self.config.system_prompt),
                                add_generation_prompt=True)
        return chat.encode(self.engine.tokenizer, trusted=self.config.trust_special_tokens)

    def request(self, question: str, config: SearchConfig, request_id: str | None = None) -> SearchRequest:
        return SearchRequest(question, self.prompt_ids(question), config, request_id)

    def close(self) -> None:
        self.verifier.close()
