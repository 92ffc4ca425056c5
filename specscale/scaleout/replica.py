"""SearchReplica: one Ray Serve replica of the search pipeline (generator engine + PRM verifier + search
runtime behind one engine thread), answering the ingress's streaming handle calls. In disaggregated
serving its PRM is the PRM deployment's, reached through `RemoteVerifier` (docs/scale-out.md).

A call runs the same code as `specscale serve`'s routes (`server/app.py` `SearchRoutes`: submit, answer,
stream), so limits, errors, SSE chunks and metrics are the same. The ingress cancels a call when its
client goes away or the call is abandoned; Ray Serve cancels the replica's generator (asyncio
cancellation), and its `finally` closes the search session, which sends the engine thread a cancel that
frees the search's KV before the next tick. See docs/scale-out.md.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic import BaseModel

from specscale.scaleout.config import ScaleOutConfig
from specscale.scaleout.messages import Answered, Rejected, StreamOpened
from specscale.scaleout.remote_verifier import RemoteVerifier
from specscale.server.app import SearchRoutes, health_report, metrics_text, model_card
from specscale.server.errors import APIError
from specscale.server.responses import CompletionFormat
from specscale.server.serving_process import ServingProcess
from specscale.server.session import SearchSession


@dataclass(frozen=True)
class ReplicaStatus:
    """One replica's /health body and /metrics text, with who it is."""

    replica_id: str
    pid: int
    node_id: str
    started_at: float
    health: dict
    metrics: str


class SearchReplica:
    def __init__(self, config: ScaleOutConfig, verifiers=None):
        """verifiers: the PRM deployment's handle in disaggregated serving (this replica then holds the
        generator only and scores through `RemoteVerifier`); None: it holds its own PRM (co-located)."""
        import torch
        from ray import serve

        torch.set_num_threads(config.torch_threads)
        self.replica_id = serve.get_replica_context().replica_tag
        self.process = ServingProcess.build(config.pipeline, config.settings, self._remote_verifier(config, verifiers))
        self.routes = SearchRoutes(self.process.engine_loop, self.process.builder, self.process.metrics, config.settings)
        self.process.engine_loop.start()
        self.started_at = time.time()

    def _remote_verifier(self, config: ScaleOutConfig, verifiers):
        if verifiers is None:
            return None
        return RemoteVerifier(verifiers, config.pipeline, self.replica_id, config.verifier_timeout_s)

    async def search(self, body: BaseModel, chat: bool, request_id: str) -> AsyncIterator:
        """Rejected | Answered, or StreamOpened then the SSE chunks (streaming handle call)."""
        started = time.monotonic()
        prepare = self.process.builder.chat if chat else self.process.builder.completion
        output = CompletionFormat(chat=chat)
        try:
            prepared, handle = await self.routes.submit(body, prepare, request_id)
        except APIError as error:
            yield Rejected.of(error)
            return
        session = SearchSession(self.process.engine_loop, handle, _no_disconnect_message, prepared.timeout_s)
        try:
            if prepared.stream:
                yield StreamOpened(self.replica_id)
                async for chunk in self.routes.stream(session, prepared, output, started):
                    yield chunk
            else:
                yield await self._answer(session, prepared, output, started)
        finally:
            session.close()

    async def _answer(self, session: SearchSession, prepared, output: CompletionFormat,
                      started: float) -> Answered | Rejected:
        try:
            return Answered(await self.routes.answer(session, prepared, output, started), self.replica_id)
        except APIError as error:
            return Rejected.of(error)

    def status(self) -> ReplicaStatus:
        import ray

        metrics = metrics_text(self.process.engine_loop, self.process.metrics)
        if isinstance(self.process.stack.verifier, RemoteVerifier):
            metrics += self.process.stack.verifier.render_metrics()
        return ReplicaStatus(self.replica_id, os.getpid(), ray.get_runtime_context().get_node_id(),
                             self.started_at, health_report(self.process.engine_loop), metrics)

    def model_card(self, created: int) -> dict:
        return model_card(self.process.settings, self.process.builder.context_tokens, created)

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose engine thread failed is replaced."""
        failure = self.process.engine_loop.failure
        if failure is not None:
            raise RuntimeError(f"the engine thread failed: {failure}")

    def __del__(self) -> None:
        process = getattr(self, "process", None)
        if process is not None:
            process.engine_loop.stop()
            process.stack.close()


async def _no_disconnect_message() -> dict:
    """The session's ASGI receive channel: a replica has none; the ingress cancels the call instead."""
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}
