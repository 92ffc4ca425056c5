"""What one generator iteration did to each sequence (`GeneratorBackend.step`), keyed by the runtime's ids."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from specscale.seam.operations import SequenceId


class SequenceState(enum.Enum):
    GENERATING = "generating"  # still sampling its segment (or waiting to run)
    STOPPED = "stopped"  # hit a stop string: paused with its KV kept, ready to be branched
    FINISHED = "finished"  # ended (EOS, token or context cap); its KV is freed
    LOST = "lost"  # preempted while it asked to be aborted rather than recomputed; its KV is freed
    READOUT = "readout"  # a prefill-only sequence computed its tokens; paused with its KV kept


class EndReason(enum.Enum):
    """Why a STOPPED or FINISHED sequence's segment ended (the API's finish_reason)."""

    STOP = "stop"  # a stop string or EOS
    LENGTH = "length"  # cut by the segment's token cap or the context limit


@dataclass(frozen=True)
class SequenceUpdate:
    """What one iteration did to one sequence. split_from: the sequence this one split off in this
    iteration (it inherits split_from's segment so far; split_from's own update comes first).
    lane_ids: the logical copies (lanes, numbered as started) this row holds now, multiplicity of them.
    end_reason: why the segment ended, once the state is STOPPED or FINISHED."""

    seq_id: SequenceId
    new_token_ids: tuple[int, ...]
    state: SequenceState
    multiplicity: int
    lane_ids: tuple[int, ...]
    split_from: SequenceId | None = None
    end_reason: EndReason = EndReason.STOP
