"""VllmVerifier: a PRM on vLLM's pooling path as a `VerifierBackend` (runtime/backend.py).

Each path's PRM input is built by our format (`verify/formats.py`: the same token ids, score positions and
context rule as `verify/prm.py` `Verifier`); vLLM runs every input of a batch in one `encode` with the
token-classification task, the STEP pooler at the format's step tag and no activation
(`PoolingParams(step_tag_id=..., use_activation=False)`: the head's raw 2-class logits at every step-tag
position), and the format's own formula (`PRMFormat.scores`) reads the score positions, so
the scores equal our verifier's within the dtype's tolerance.

- qwen-math-prm (`Qwen2ForProcessRewardModel`, the toy PRM): supported.
- rlhflow (a causal LM read as P("+") against P("-") before each "+"): refused with one line — vLLM's
  pooling path returns a pooling head's outputs, not the LM head's logits at chosen positions, and its
  prompt logprobs give only the top-k tokens, so P("-") is not always there.

`tokens_to_compute` is the path's whole input: token-level pooling needs every position's hidden state, so
vLLM's prefix cache is off for it and every path is recomputed in full (our verifier runs only the new
step); `computed_tokens` is the same count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from specscale.model.loader import read_hf_config
from specscale.pipeline import PipelineConfig
from specscale.seam import KVUsage, ScoreRequest, ScoreResult
from specscale.tokenizer import Tokenizer
from specscale.verify.formats import PRMFormat, PRMInput, clean_steps, make_format
from specscale.vllm_backend.engine_args import (
    DEFAULT_BLOCK_SIZE,
    VllmBackendError,
    engine_failure,
    import_vllm,
    merged_args,
)

SUPPORTED_FORMATS = ("qwen-math-prm",)
GENERATOR_ONLY_ARGS = ("enable_prefix_caching",)  # a --vllm-arg for the generator that the PRM does not take


class VllmVerifier:
    def __init__(self, model: str, engine_args: Mapping[str, Any], prm_format: PRMFormat):
        if prm_format.name not in SUPPORTED_FORMATS:
            raise VllmBackendError(
                f"PRM format {prm_format.name} on vLLM: its pooling path has no LM-head logits at chosen positions "
                "(P('+') vs P('-')); use --verifier-backend engine")
        vllm = import_vllm()
        self.model = model
        self._format = prm_format
        self._step_tag_id: int = prm_format.step_tag_id  # type: ignore[attr-defined]
        self._params = vllm.PoolingParams(step_tag_id=self._step_tag_id, use_activation=False)
        try:
            self.llm = vllm.LLM(**engine_args)
        except (ValueError, TypeError, RuntimeError, OSError, NotImplementedError, KeyError) as error:
            raise engine_failure(model, error) from None
        self._max_len: int = self.llm.llm_engine.model_config.max_model_len

    @classmethod
    def from_config(cls, config: PipelineConfig, overrides: Mapping[str, Any]) -> VllmVerifier:
        tokenizer = Tokenizer(config.prm)
        prm_format = make_format(tokenizer, read_hf_config(config.prm), None, config.trust_special_tokens)
        args = {key: value for key, value in overrides.items() if key not in GENERATOR_ONLY_ARGS}
        defaults = {"model": config.prm, "runner": "pooling", "dtype": config.prm_dtype, "seed": config.seed,
                    "enable_prefix_caching": False, "block_size": DEFAULT_BLOCK_SIZE, "skip_tokenizer_init": True,
                    "disable_log_stats": True}
        return cls(config.prm, merged_args(defaults, args), prm_format)

    # ---- VerifierBackend -------------------------------------------------------------------------
    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        plans = [self._plan(request) for request in requests]
        inputs = [target for _, target, _ in plans if target is not None]
        readouts = self._encode(inputs) if inputs else []
        results, used = [], 0
        for num_steps, target, error in plans:
            if target is None:
                results.append(ScoreResult((), num_steps, error, 0, error is not None and num_steps > 0))
                continue
            logits = readouts[used]
            used += 1
            tags = [i for i, token in enumerate(target.token_ids) if token == self._step_tag_id]
            rows = {position: row for row, position in enumerate(tags)}
            scores = self._format.scores(logits[[rows[position] for position in target.score_positions]])
            results.append(ScoreResult(tuple(scores), num_steps, error, len(target.token_ids), error is not None))
        return results

    def tokens_to_compute(self, request: ScoreRequest) -> int:
        _, target, _ = self._plan(request)
        return 0 if target is None else len(target.token_ids)

    @property
    def kv_usage(self) -> KVUsage:
        pool = self.llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
        total = pool.num_gpu_blocks - 1
        return KVUsage(total - pool.get_num_free_blocks(), total)

    @property
    def format(self) -> PRMFormat:
        return self._format

    @property
    def max_input_tokens(self) -> int:
        return self._max_len

    def close(self) -> None:
        pass  # vLLM's engine is freed with the verifier

    # ---- inputs ----------------------------------------------------------------------------------
    def _plan(self, request: ScoreRequest) -> tuple[int, PRMInput | None, str | None]:
        """(non-empty steps, the input of the steps that fit the context, why not all are scored)."""
        steps = clean_steps(request.steps)
        if not steps:
            return 0, None, "no non-empty steps to score"
        full = self._format.encode(request.question, steps)
        fitting = sum(end <= self._max_len for end in full.step_ends)
        error = None
        if fitting < len(steps):
            error = (f"PRM input of {len(full.token_ids)} tokens exceeds the PRM context of {self._max_len}: "
                     f"{fitting} of {len(steps)} steps fit")
        return len(steps), full.first_steps(fitting) if fitting else None, error

    def _encode(self, inputs: list[PRMInput]) -> list[torch.Tensor]:
        prompts = [{"prompt_token_ids": list(target.token_ids)} for target in inputs]
        outputs = self.llm.encode(prompts, self._params, pooling_task="token_classify", use_tqdm=False)
        return [out.outputs.data.float() for out in outputs]
