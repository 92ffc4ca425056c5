"""EngineBackend: the real engine behind the runtime's seam. Rows a CD sequence splits into take the ids
its operation reserved, operations on ended sequences are ignored, and every id mapping is dropped once
its sequence ends."""

from engine_helpers import make_engine

from specscale.engine.sequence import SamplingParams
from specscale.search.backend import (
    AbortSequence, BranchSequence, PauseSequence, PrioritizeSequence, SequenceState, StartSequence,
)
from specscale.search.engine_backend import EngineBackend

PROMPT = (5, 17, 42, 99, 120, 7)


def run_to_idle(backend: EngineBackend) -> list:
    updates = []
    while backend.has_work():
        updates += backend.step()
    return updates


def test_split_rows_take_the_reserved_ids_and_copies_are_conserved(qwen2_dir):
    backend = EngineBackend(make_engine(qwen2_dir))
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=3, ignore_eos=True)
    roots = {100: (101, 102, 103, 104, 105, 106, 107), 200: (201, 202, 203, 204, 205, 206, 207)}
    backend.apply([StartSequence(seq_id, PROMPT, params, multiplicity=8, split_ids=reserved)
                   for seq_id, reserved in roots.items()])
    updates = run_to_idle(backend)
    family = {seq_id: seq_id for seq_id in roots}
    copies: dict[int, int] = {}
    for update in updates:
        if update.split_from is not None:
            family[update.seq_id] = family[update.split_from]
        assert update.seq_id in roots.get(family[update.seq_id], ()) or update.seq_id in roots
        copies[update.seq_id] = update.multiplicity
    assert len(copies) > len(roots)  # eight copies at temperature 1 do split
    for root in roots:
        assert sum(n for seq_id, n in copies.items() if family[seq_id] == root) == 8
    assert {u.state for u in updates} <= {SequenceState.GENERATING, SequenceState.FINISHED}
    assert backend.num_live_sequences == 0 and backend.kv_usage.used_blocks == 0
    assert not backend._to_engine and not backend._from_engine  # every mapping dropped


def test_branch_pause_resume_and_operations_on_ended_sequences(qwen2_dir):
    backend = EngineBackend(make_engine(qwen2_dir))
    backend.apply([StartSequence(0, PROMPT, None, readout_positions=(len(PROMPT) - 1,))])
    assert [u.state for u in run_to_idle(backend)] == [SequenceState.READOUT]
    params = SamplingParams(temperature=0.0, max_new_tokens=4, ignore_eos=True)
    backend.apply([BranchSequence(1, 0, params, (9,)), BranchSequence(2, 0, params, (9,)), AbortSequence(0)])
    assert {u.seq_id for u in backend.step()} == {1, 2}
    backend.apply([PauseSequence(2)])
    first = run_to_idle(backend)
    assert {u.seq_id for u in first} == {1} and first[-1].state == SequenceState.FINISHED
    backend.apply([PrioritizeSequence(2, 5, resume=True), PrioritizeSequence(1, 5), AbortSequence(1)])  # 1 ended
    second = run_to_idle(backend)
    assert {u.seq_id for u in second} == {2}
    assert [u.new_token_ids for u in second] == [u.new_token_ids for u in first]  # greedy: the same tokens
    assert backend.num_live_sequences == 0 and backend.kv_usage.used_blocks == 0
