"""The backend seam's values: what crosses between a `SearchRuntime` and its backends, and nothing else.

A leaf package: it imports nothing of specscale, and every side of the seam imports it — the engine and the
verifier that fill these values (engine/, verify/), the runtime that reads them and its protocols
(`runtime/backend.py` `GeneratorBackend` / `VerifierBackend`), the simulator (sim/), the remote verifier
(scaleout/) and the scripted test backends — so no side reaches into another's internals and no package
cycle can form (tests/test_imports.py).

- `operations.py`: what the runtime asks a generator backend to do (`StartSequence`, `BranchSequence`,
  `AbortSequence`, `PauseSequence`, `PrioritizeSequence`), naming sequences by `SequenceId`;
- `updates.py`: what one iteration did to a sequence (`SequenceUpdate`, `SequenceState`, `EndReason`);
- `sampling.py`: `SamplingParams`, how a segment samples and when it stops;
- `scoring.py`: `ScoreRequest` / `ScoreResult`, a path to score and its step scores;
- `kv_usage.py`: `KVUsage`, a backend's KV blocks in use.

Naming. The runtime names every sequence (`SequenceId`, unique for the backend's life). A sequence of
multiplicity m (computation deduplication) may split into at most m rows before its segment ends, as
its m copies draw different tokens; the operation that starts it reserves the m - 1 ids its split-off
rows take (`split_ids`, used in order by the whole family), so a split needs no round trip to be named.

Lanes. A seeded sequence of multiplicity m is started with one seed per logical copy (`lane_seeds`); copy
j is *lane* j and samples only from its own seed, and every update names the lanes its row holds
(`lane_ids`), so a split row tells which logical children it carries (docs/design.md, "CD lanes", "Seeds").
"""

from specscale.seam.kv_usage import KVUsage
from specscale.seam.operations import (
    AbortSequence,
    BranchSequence,
    PauseSequence,
    PrioritizeSequence,
    SequenceId,
    SequenceOp,
    StartSequence,
)
from specscale.seam.sampling import SamplingParams
from specscale.seam.scoring import ScoreRequest, ScoreResult
from specscale.seam.updates import EndReason, SequenceState, SequenceUpdate

__all__ = [
    "AbortSequence", "BranchSequence", "EndReason", "KVUsage", "PauseSequence", "PrioritizeSequence",
    "SamplingParams", "ScoreRequest", "ScoreResult", "SequenceId", "SequenceOp", "SequenceState",
    "SequenceUpdate", "StartSequence",
]
