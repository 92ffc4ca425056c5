"""Pipeline: the `stack.py` `Stack` on real checkpoints — our engine for the generator, the PRM verifier in this
process or served elsewhere — built from one frozen description, `PipelineConfig`.

The CLI (`specscale solve`, `specscale bench`, `specscale eval`) and the server build it through
`composition.py` `build_stack`, so they agree on defaults: the bundled toy models, served in their checkpoint
dtype (bf16), on CPU. `device_properties` is this kind's one call of the shared resolver
(`device_resolver.py`), which `sim/simulation.py` calls too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specscale.chat_text import render_chat_text
from specscale.config import EngineConfig, SearchConfig
from specscale.costmodel.model_profile import ModelProfile
from specscale.costmodel.row_budget import device_cost_model
from specscale.defaults import TOY_GENERATOR, TOY_PRM
from specscale.device_resolver import resolve_device_properties
from specscale.engine.decode_profile import load_row_budget
from specscale.engine.engine import Engine
from specscale.prompts import TOY_GENERATOR_SYSTEM_PROMPT, chat_messages
from specscale.runtime.backend import VerifierBackend
from specscale.runtime.device_properties import DeviceProperties
from specscale.runtime.runtime import SearchRequest
from specscale.stack import Stack
from specscale.verify.prm import PRM_MAX_BATCHED_TOKENS, PRM_MAX_SEQS, Verifier, VerifierConfig
from specscale.verify.profile import load_lv_threshold, profile_at_start


@dataclass(frozen=True)
class PipelineConfig:
    """generator / prm: local Hugging Face folders. lv_threshold_tokens None reads the profiler's file
    (`specscale profile-prm`) for this PRM and device; without one, profile_prm profiles the PRM at the
    pipeline's start and caches the file (the system finds the threshold itself: docs/design.md), else the knee on
    the device's cost model, else 2048 (`device_properties`, verify/profile.py). trust_special_tokens:
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
    # budget from its cost model (costmodel/row_budget.py), unbounded on a device without a profile
    max_concurrency: int = 32
    lv_threshold_tokens: int | None = None
    system_prompt: str = TOY_GENERATOR_SYSTEM_PROMPT
    seed: int = 0
    trust_special_tokens: bool = False
    kernels: str = "auto"  # EngineConfig.kernels of both engines
    profile_prm: bool = True  # a PRM never profiled on this device is profiled at start (verify/profile.py)

    def build(self) -> Pipeline:
        """The stack this describes, its PRM in this process (`composition.py` `build_stack`)."""
        return Pipeline(self)


def build_verifier(config: PipelineConfig) -> Verifier:
    """The PRM verifier of this config (a pipeline's own, or a PRM replica's in disaggregated serving:
    docs/scale-out.md)."""
    return Verifier(VerifierConfig(EngineConfig(
        model=config.prm, dtype=config.prm_dtype, device=config.device, kv_cache_memory_gb=config.prm_kv_gb,
        max_num_batched_tokens=PRM_MAX_BATCHED_TOKENS, max_num_seqs=PRM_MAX_SEQS, seed=config.seed,
        kernels=config.kernels,
    ), trust_special_tokens=config.trust_special_tokens))


def device_properties(config: PipelineConfig, prm_is_local: bool = True) -> DeviceProperties:
    """The config's device properties, through the resolver the simulated stack calls too
    (device_resolver.py). A local PRM with no profile on this device is profiled now when config.profile_prm
    (before any engine is built); a PRM served elsewhere (docs/scale-out.md) is not profiled here: its profile
    file if this machine has one, else the cost model's knee."""
    name = torch.cuda.get_device_name(config.device) if config.device.startswith("cuda") else None
    generator = ModelProfile.load(config.generator, _dtype(config.generator_dtype))

    def prm() -> ModelProfile:  # read only when the cost model's knee is needed
        return ModelProfile.load(config.prm, _dtype(config.prm_dtype))

    return resolve_device_properties(
        device_cost_model(config.device, name), generator, prm, config.max_num_seqs, config.lv_threshold_tokens,
        config.spare_rows, profiled_lv=_profiled_lv(config, prm_is_local),
        measured_rows=load_row_budget(config.generator, config.device),
    )


def _profiled_lv(config: PipelineConfig, prm_is_local: bool) -> int | None:
    """The PRM's knee measured on this device: its profile file, else (a local PRM, profile_prm) a profile
    taken now; None with an override (nothing to measure) or neither."""
    if config.lv_threshold_tokens is not None:
        return None
    profiled = load_lv_threshold(config.prm, config.device)
    if profiled is None and config.profile_prm and prm_is_local:
        return profile_at_start(config.prm, config.prm_dtype, config.device)
    return profiled


def _dtype(name: str) -> str | None:
    return None if name == "auto" else name


class Pipeline(Stack):
    """verifier: a verifier served elsewhere (`scaleout/remote_verifier.py`, docs/scale-out.md), which must
    also carry the PRM's `format` and `max_input_tokens`; None builds the PRM verifier in this process."""

    engine: Engine  # the generator always runs on our engine here

    def __init__(self, config: PipelineConfig = PipelineConfig(), clock=None, verifier: VerifierBackend | None = None):
        self.config = config
        device = device_properties(config, prm_is_local=verifier is None)
        engine = Engine(EngineConfig(
            model=config.generator, dtype=config.generator_dtype, device=config.device,
            kv_cache_memory_gb=config.generator_kv_gb, max_num_seqs=config.max_num_seqs, seed=config.seed,
            spare_rows=device.spare_rows, kernels=config.kernels,
        ))
        super().__init__(engine, verifier or build_verifier(config), clock or time.perf_counter, device,
                         config.max_concurrency, engine.tokenizer, engine.max_model_len)

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
        chat = render_chat_text(self.tokenizer, chat_messages(question, self.config.system_prompt),
                                add_generation_prompt=True)
        return chat.encode(self.tokenizer, trusted=self.config.trust_special_tokens)

    def request(self, question: str, config: SearchConfig, request_id: str | None = None) -> SearchRequest:
        return SearchRequest(question, self.prompt_ids(question), config, request_id)
