"""The vLLM backend's segment rules (specscale/vllm_backend/sequence.py `SegmentRules`), which take a request's
new tokens of one step at once where none can end the segment: on random token streams they end every segment
where a straightforward token-by-token reference does (EOS, a stop string split across tokens, the segment's
token cap, the context limit), with the same tokens taken and the same state left behind. Needs no vLLM."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from specscale.seam import EndReason, SamplingParams, SequenceState
from specscale.vllm_backend.sequence import SegmentRules, VllmSequence

# Hand-made vocabulary: "\n\n" and "</s>"-like stops arrive whole, split over two tokens, or inside longer ones.
TOKEN_BYTES = [b"a", b"b", b"\n", b"\n\n", b"x\n", b"\ny", b"ab", b"", b"x\n\ny", b"<", b"/", b"s>", b"</s>",
               b"\xe2", b"\x80\x94", b"c\n", b"\nd", b"<sto", b"p>", b"z"]
EOS = frozenset({19})
VOCAB = len(TOKEN_BYTES) + 2  # ids past TOKEN_BYTES have no bytes (as the rules read them)


@dataclass
class Reference:
    """The rules token by token, as written before `SegmentRules` took a step's tokens at once."""

    token_bytes: list[bytes]
    eos: frozenset[int]
    max_model_len: int
    stops: dict = field(default_factory=dict)

    def take(self, seq: VllmSequence, new_tokens: list[int]) -> tuple[list[int], SequenceState, EndReason]:
        params = seq.params
        assert params is not None
        taken = []
        for token in new_tokens:
            seq.tokens.append(token)
            seq.segment_tokens += 1
            taken.append(token)
            if token in self.eos and not params.ignore_eos:
                return taken, SequenceState.FINISHED, EndReason.STOP
            if params.stop and self.hits(seq, params.stop, token):
                return taken, SequenceState.STOPPED, EndReason.STOP
            if seq.segment_tokens >= params.max_new_tokens or len(seq.tokens) >= self.max_model_len:
                return taken, SequenceState.FINISHED, EndReason.LENGTH
        return taken, SequenceState.GENERATING, EndReason.STOP

    def hits(self, seq: VllmSequence, stop: tuple[str, ...], token: int) -> bool:
        stops = [s.encode() for s in stop]
        keep = max(len(s) for s in stops) - 1
        text = seq.stop_tail + (self.token_bytes[token] if token < len(self.token_bytes) else b"")
        if any(s in text for s in stops):
            seq.stop_tail = b""
            return True
        seq.stop_tail = text[-keep:] if keep else b""
        return False


def state_of(seq: VllmSequence) -> tuple:
    return list(seq.tokens), seq.segment_tokens, seq.stop_tail


PARAMS = [SamplingParams(stop=("\n\n",), max_new_tokens=40), SamplingParams(stop=("\n\n", "</s>"), max_new_tokens=25),
          SamplingParams(stop=("\n\n",), max_new_tokens=12, ignore_eos=True), SamplingParams(max_new_tokens=9),
          SamplingParams(stop=("<stop>", "\n"), max_new_tokens=30), SamplingParams(stop=("—",), max_new_tokens=50)]


@pytest.mark.parametrize("seed", range(6))
def test_rules_end_where_the_per_token_reference_does(seed):
    rng = random.Random(seed)
    for max_model_len in (30, 64, 4096):
        rules = SegmentRules(TOKEN_BYTES, EOS, max_model_len)
        reference = Reference(TOKEN_BYTES, EOS, max_model_len)
        for params in PARAMS:
            for _ in range(150):
                prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 20))]
                ours, theirs = VllmSequence(0, list(prompt), params, 0), VllmSequence(0, list(prompt), params, 0)
                tail = rng.choice([b"", b"\n", b"<", b"<st", b"\xe2"])  # a resumed segment's bytes so far
                ours.stop_tail = theirs.stop_tail = tail
                ours.segment_tokens = theirs.segment_tokens = rng.randrange(3)
                state = SequenceState.GENERATING
                while state == SequenceState.GENERATING:  # one vLLM step's tokens at a time: 1 mostly, a few at times
                    n = rng.choice([1, 1, 1, 2, 3, 5, 0])
                    new = [rng.randrange(VOCAB) if rng.random() < 0.9 else rng.choice([2, 3, 12, 19])
                           for _ in range(n)]
                    expected = reference.take(theirs, list(new))
                    got = rules.take(ours, list(new))
                    assert got == expected, (params, tail, new)
                    assert state_of(ours) == state_of(theirs), (params, tail, new)
                    advanced = rules.advance(VllmSequence(0, list(prompt), params, 0), tuple(new))
                    assert isinstance(advanced[0], tuple)
                    state = got[1]
                    if len(ours.tokens) > max_model_len + 10:
                        break


def test_a_step_taken_whole_is_the_same_tuple():
    rules = SegmentRules(TOKEN_BYTES, EOS, 4096)
    seq = VllmSequence(0, [0], SamplingParams(stop=("\n\n",)), 0)
    new = (0, 2, 1)
    taken, state, _ = rules.advance(seq, new)
    assert taken is new and state == SequenceState.GENERATING and seq.stop_tail == b"b"
    taken, state, reason = rules.advance(seq, (4, 5, 0))  # "x\n" then "\ny": the stop spans the two tokens
    assert (taken, state, reason) == ((4, 5), SequenceState.STOPPED, EndReason.STOP)
