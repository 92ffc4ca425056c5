"""Which backends a command runs on: `--backend engine|vllm` (both), `--generator-backend` /
`--verifier-backend` (each apart, default `--backend`'s) and `--vllm-arg key=value` (repeatable: vLLM's engine
arguments, `engine_args.py`), for `specscale solve`, `serve` and `eval`; `specscale bench` takes the last three
(`add_vllm_selection_arguments`) beside its own `--backend real|sim|vllm`.

`stack_description` turns them into the description `composition.py` `build_stack` builds: the plain
`PipelineConfig` when both are our engine, else a `VllmPipelineConfig`. It checks before anything loads:
vLLM missing, a bad `--vllm-arg`, an unknown backend are each a `VllmBackendError` of one line.
"""

from __future__ import annotations

import argparse

from specscale.pipeline import PipelineConfig
from specscale.vllm_backend.engine_args import ARG_TYPES, VllmBackendError, import_vllm, parse_vllm_args
from specscale.vllm_backend.stack import BACKENDS, VllmPipelineConfig


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="engine", choices=BACKENDS,
                        help="engine: SpecScale's own engine; vllm: vLLM's V1 engine in this process "
                             "(optional: docs/gpu.md) for the generator and the PRM")
    add_vllm_selection_arguments(parser)


def add_vllm_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """--generator-backend, --verifier-backend (each default: --backend's) and --vllm-arg."""
    parser.add_argument("--generator-backend", default=None, choices=BACKENDS, help="the generator's (default: --backend)")
    parser.add_argument("--verifier-backend", default=None, choices=BACKENDS, help="the PRM's (default: --backend)")
    parser.add_argument("--vllm-arg", action="append", default=[], metavar="KEY=VALUE",
                        help=f"a vLLM engine argument, repeatable ({', '.join(sorted(ARG_TYPES))})")


def chosen_backends(args: argparse.Namespace) -> tuple[str, str]:
    backend = getattr(args, "backend", "engine")
    return (getattr(args, "generator_backend", None) or backend, getattr(args, "verifier_backend", None) or backend)


def stack_description(args: argparse.Namespace, pipeline: PipelineConfig) -> PipelineConfig | VllmPipelineConfig:
    """The description of the stack these arguments ask for (VllmBackendError: one line, nothing loaded)."""
    generator, verifier = chosen_backends(args)
    vllm_args = parse_vllm_args(getattr(args, "vllm_arg", None) or [])
    if generator == "engine" and verifier == "engine":
        if vllm_args:
            raise VllmBackendError("--vllm-arg needs --backend vllm (or --generator-backend / --verifier-backend vllm)")
        return pipeline
    import_vllm()
    return VllmPipelineConfig(pipeline, generator, verifier, vllm_args)
