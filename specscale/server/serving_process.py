"""ServingProcess: what one serving process runs — its stack (generator engine, PRM verifier, the runtimes
over them; built by `composition.py` `build_stack`), the engine thread in front of it, the request builder
and the metrics — from a `PipelineConfig` and `ServerSettings`. `specscale serve` puts one behind its FastAPI
app; each Ray Serve replica of `specscale serve --ray` holds one (docs/scale-out.md)."""

from __future__ import annotations

from dataclasses import dataclass

from specscale.composition import RemoteVerifierPipeline, StackDescription, build_stack
from specscale.model import prefill_warmup
from specscale.model.row_padding import warm_engines
from specscale.pipeline import Pipeline, PipelineConfig
from specscale.runtime.backend import VerifierBackend
from specscale.server.engine_loop import EngineLoop
from specscale.server.metrics import ServerMetrics
from specscale.server.search_builder import SearchBuilder
from specscale.server.settings import ServerSettings
from specscale.stack import Stack


@dataclass(frozen=True)
class ServingProcess:
    stack: Pipeline | Stack  # a Pipeline, or another backend's stack (vllm_backend/stack.py VllmStack)
    engine_loop: EngineLoop
    builder: SearchBuilder
    metrics: ServerMetrics
    settings: ServerSettings

    @classmethod
    def build(cls, pipeline_config: PipelineConfig, settings: ServerSettings,
              verifier: VerifierBackend | None = None,
              description: StackDescription | None = None) -> ServingProcess:
        """Loads both models (the slow part), or only the generator when given a verifier served elsewhere
        (a remote PRM deployment: docs/scale-out.md); the engine thread is not started yet. description: the
        stack to build instead of pipeline_config's (another backend: `specscale serve --backend vllm`)."""
        from specscale.grading import shared_grader

        shared_grader().start()  # votes over non-numeric answers use math-verify: its worker imports while models load
        stack = build_stack(description or (
            pipeline_config if verifier is None else RemoteVerifierPipeline(pipeline_config, verifier)))
        warm_engines(stack.local_engines())  # oneDNN's primitive for every row count now (model/row_padding.py)
        metrics = ServerMetrics()
        engine_loop = EngineLoop(stack.runtime, metrics, settings.max_waiting, settings.retry_after_s,
                                 model_memory=stack.model_memory, kernels=stack.kernels(),
                                 warm=lambda: prefill_warmup.warm_engines(stack.local_engines()))
        builder = SearchBuilder.for_stack(stack, pipeline_config.system_prompt, settings)
        return cls(stack, engine_loop, builder, metrics, settings)
