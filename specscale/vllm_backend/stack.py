"""VllmPipelineConfig: the frozen description of a stack whose generator (and optionally PRM) runs on vLLM's
V1 engine in this process; `build()` composes a `VllmStack` (`composition.py` `build_stack`).

The generator and the verifier backends are chosen apart: `generator_backend` "vllm" (this package's
`VllmGenerator`) or "engine" (our engine, the plain `Pipeline`), `verifier_backend` "vllm" (`VllmVerifier`,
vLLM's pooling path) or "engine" (`verify/prm.py` `Verifier`). The device properties are resolved once,
through `device_resolver.py`, before any engine is built: the row budget on the device's cost model (no
measured budget: `specscale profile-decode` measures our engine, not vLLM), the LV threshold from the PRM's
profile or knee; the row budget reaches `VllmGenerator`, which holds speculative requests back by it.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from specscale.chat_text import render_chat_text
from specscale.config import SearchConfig
from specscale.costmodel.model_profile import ModelProfile
from specscale.costmodel.row_budget import device_cost_model
from specscale.device_resolver import resolve_device_properties
from specscale.pipeline import Pipeline, PipelineConfig, build_verifier
from specscale.prompts import chat_messages
from specscale.runtime.backend import GeneratorBackend, VerifierBackend
from specscale.runtime.device_properties import DeviceProperties
from specscale.runtime.runtime import SearchRequest
from specscale.stack import Stack
from specscale.tokenizer import Tokenizer
from specscale.verify.profile import load_lv_threshold
from specscale.vllm_backend.engine_args import VllmBackendError, import_vllm, split_backend_args
from specscale.vllm_backend.engine_client import (
    VllmEngineClient,
    generator_engine_args,
    seeds_per_request,
    unseeded_notice,
)
from specscale.vllm_backend.generator import VllmGenerator

BACKENDS = ("engine", "vllm")


@dataclass(frozen=True)
class VllmPipelineConfig:
    """pipeline: models, device, seeds, limits (as for our engine); generator_backend / verifier_backend:
    "vllm" or "engine"; vllm_args: `--vllm-arg`s, passed to vLLM as given but for SpecScale's own
    (`request_seeds`, engine_args.py)."""

    pipeline: PipelineConfig = PipelineConfig()
    generator_backend: str = "vllm"
    verifier_backend: str = "vllm"
    vllm_args: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for name in (self.generator_backend, self.verifier_backend):
            if name not in BACKENDS:
                raise VllmBackendError(f"backend {name!r}: expected one of {', '.join(BACKENDS)}")

    def build(self) -> Pipeline | VllmStack:
        """Our engine where both are "engine"; else a `VllmStack` (vLLM imported here, not before)."""
        if self.generator_backend == "engine" and self.verifier_backend == "engine":
            return Pipeline(self.pipeline)
        import_vllm()  # the install line before anything loads
        return VllmStack(self)


def device_properties(config: VllmPipelineConfig) -> DeviceProperties:
    """The stack's device properties through the shared resolver: the cost model's row budget (vLLM's decode
    was never measured here), the PRM's profiled knee if this machine has one, else its knee on the cost model."""
    p = config.pipeline
    name = torch.cuda.get_device_name(p.device) if p.device.startswith("cuda") else None
    generator = ModelProfile.load(p.generator, None if p.generator_dtype == "auto" else p.generator_dtype)
    profiled = None if p.lv_threshold_tokens is not None else load_lv_threshold(p.prm, p.device)
    return resolve_device_properties(
        device_cost_model(p.device, name), generator,
        lambda: ModelProfile.load(p.prm, None if p.prm_dtype == "auto" else p.prm_dtype), p.max_num_seqs,
        p.lv_threshold_tokens, p.spare_rows, profiled_lv=profiled,
    )


class VllmStack(Stack):
    """A stack whose generator is vLLM's (or ours) and whose verifier is vLLM's (or ours). `engine` is ours
    when the generator runs on it, else None (`Stack.local_engines` then has only the PRM's, if it is ours)."""

    tokenizer: Tokenizer  # the generator checkpoint's own

    def __init__(self, config: VllmPipelineConfig, clock=None):
        self.config = config
        p = config.pipeline
        device = device_properties(config)
        self.client: VllmEngineClient | None = None
        self.request_seeds = True  # the lanes' seeds go with their vLLM requests (`_resolve_request_seeds`)
        if config.generator_backend == "vllm":
            tokenizer = Tokenizer(p.generator)
            engine_args, seeds_mode = split_backend_args(config.vllm_args)
            args = generator_engine_args(p.generator, p.generator_dtype, p.seed, p.max_num_seqs, engine_args)
            self.client = VllmEngineClient(args, sorted(tokenizer.eos_token_ids))
            self.request_seeds = self._resolve_request_seeds(self.client, seeds_mode)
            super().__init__(None, self._verifier(config), clock or time.perf_counter, device, p.max_concurrency,
                             tokenizer, self.client.max_model_len)
        else:
            our = Pipeline(replace(p, profile_prm=False), verifier=self._verifier(config))
            super().__init__(our.engine, our.verifier, clock or time.perf_counter, device, p.max_concurrency,
                             our.tokenizer, our.context_tokens)

    @staticmethod
    def _resolve_request_seeds(client: VllmEngineClient, mode: str) -> bool:
        """`seeds_per_request` on this engine's device and chunked-prefill setting; the one-line notice on
        stderr when "auto" leaves the lanes unseeded."""
        seeded = seeds_per_request(mode, client.device_type, client.chunked_prefill)
        if not seeded and mode == "auto":
            print(unseeded_notice(client.device_type), file=sys.stderr, flush=True)
        return seeded

    @staticmethod
    def _verifier(config: VllmPipelineConfig) -> VerifierBackend:
        if config.verifier_backend == "engine":
            return build_verifier(config.pipeline)
        from specscale.vllm_backend.verifier import VllmVerifier

        return VllmVerifier.from_config(config.pipeline, split_backend_args(config.vllm_args)[0])

    def backends(self) -> tuple[GeneratorBackend, VerifierBackend]:
        if self.client is None:  # the generator on our engine
            return super().backends()
        return VllmGenerator(self.client, self.tokenizer, self.device.spare_rows, self.request_seeds), self.verifier

    def forget_cached_prefixes(self) -> None:
        super().forget_cached_prefixes()
        if self.client is not None:
            self.client.reset_prefix_cache()

    def generator_kv_blocks(self) -> int:
        return super().generator_kv_blocks() if self.client is None else self.client.kv_usage.total_blocks

    def describe(self) -> str:
        """The start-up line of `specscale serve` (and a vLLM bench's record): which backend runs each model,
        and whether the generator's lanes go to vLLM unseeded."""
        c = self.config
        version = _vllm_version()
        seeds = "" if self.request_seeds else " (lanes without per-request seeds)"
        return (f"generator {c.pipeline.generator} on {'vLLM ' + version if c.generator_backend == 'vllm' else 'our engine'}"
                f"{seeds}, PRM {c.pipeline.prm} on {'vLLM ' + version if c.verifier_backend == 'vllm' else 'our engine'}")

    def kernels(self) -> dict:
        return {"generator": f"vllm {_vllm_version()}" if self.client is not None else "engine"}

    def model_memory(self) -> dict:
        return {}

    def prompt_ids(self, question: str) -> list[int]:
        chat = render_chat_text(self.tokenizer, chat_messages(question, self.config.pipeline.system_prompt),
                                add_generation_prompt=True)
        return chat.encode(self.tokenizer, trusted=self.config.pipeline.trust_special_tokens)

    def request(self, question: str, config: SearchConfig, request_id: str | None = None) -> SearchRequest:
        return SearchRequest(question, self.prompt_ids(question), config, request_id)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        super().close()


def _vllm_version() -> str:
    return str(getattr(import_vllm(), "__version__", "?"))
