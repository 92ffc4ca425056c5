"""What a generator replica and a PRM replica exchange in disaggregated serving (docs/scale-out.md,
"Co-located vs disaggregated"): a `ScoreCall` is one generator replica's PRM batch (the paths its search
runtime's verification queue released in one tick); the `ScoreReply` carries their scores back, in order,
with the PRM replica's KV use and how many generator replicas' calls its PRM batch merged."""

from __future__ import annotations

from dataclasses import dataclass

from specscale.seam import KVUsage, ScoreRequest, ScoreResult


@dataclass(frozen=True)
class ScoreCall:
    caller: str  # the generator replica's id
    requests: tuple[ScoreRequest, ...]


@dataclass(frozen=True)
class ScoreReply:
    results: tuple[ScoreResult, ...]  # one per request of the call, in order
    prm_kv: KVUsage  # the PRM replica's KV blocks after the batch
    merged_callers: int  # distinct generator replicas whose calls made up the PRM batch
