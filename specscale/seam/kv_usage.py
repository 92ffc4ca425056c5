"""KVUsage: a backend's KV blocks in use (the engine's block manager, the verifier's PRM engine, a remote
PRM replica), as the runtime and the server read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVUsage:
    """KV blocks in use out of a pool's total."""

    used_blocks: int
    total_blocks: int
