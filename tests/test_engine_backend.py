"""EngineBackend: the real engine behind the runtime's seam. Rows a CD sequence splits into take the ids
its operation reserved and carry their lanes (each drawing from its own lane seed), updates tell a stop
from a token-cap cut, operations on ended sequences are ignored, and every id mapping is dropped once its
sequence ends."""

import dataclasses

from engine_helpers import make_engine
from specscale.engine.generator_backend import EngineBackend
from specscale.seam import (
    AbortSequence,
    BranchSequence,
    EndReason,
    PauseSequence,
    PrioritizeSequence,
    SamplingParams,
    SequenceState,
    StartSequence,
)

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


def lane_tokens(backend: EngineBackend, op: StartSequence) -> dict[int, list[int]]:
    """Each lane's tokens, read off the updates: a lane gets the tokens of the row that holds it."""
    backend.apply([op])
    lanes: dict[int, list[int]] = {}
    for update in run_to_idle(backend):
        for lane in update.lane_ids:
            lanes.setdefault(lane, []).extend(update.new_token_ids)
    return lanes


def test_a_laned_row_samples_what_its_copies_sample_as_separate_rows(qwen2_dir):
    """docs/design.md, "Seeds": lane j of a CD row draws from lane_seeds[j] alone, and the updates say which
    lanes each (split) row holds."""
    seeds = (11, 22, 33, 44, 55, 66)
    params = SamplingParams(temperature=1.0, max_new_tokens=5, ignore_eos=True)
    backend = EngineBackend(make_engine(qwen2_dir))
    row = lane_tokens(backend, StartSequence(0, PROMPT, params, multiplicity=6, split_ids=(1, 2, 3, 4, 5),
                                             lane_seeds=seeds))
    assert sorted(row) == list(range(6)) and all(len(tokens) == 5 for tokens in row.values())
    assert len({tuple(tokens) for tokens in row.values()}) > 1  # the copies did split
    for j, seed in enumerate(seeds):
        alone = lane_tokens(backend, StartSequence(10 + j, PROMPT, params, lane_seeds=(seed,)))
        assert alone == {0: row[j]}
    assert backend.num_live_sequences == 0


def test_updates_say_whether_a_segment_stopped_or_was_cut_by_its_token_cap(qwen2_dir):
    backend = EngineBackend(make_engine(qwen2_dir))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=3, ignore_eos=True)
    backend.apply([StartSequence(0, PROMPT, greedy)])
    updates = run_to_idle(backend)
    assert updates[-1].state == SequenceState.FINISHED and updates[-1].end_reason == EndReason.LENGTH
    first_text = backend.decode(updates[0].new_token_ids)
    assert first_text  # the same greedy row stopped at its first token's text ends with "stop"
    backend.apply([StartSequence(1, PROMPT, dataclasses.replace(greedy, stop=(first_text,)))])
    stopped = run_to_idle(backend)
    assert [u.state for u in stopped] == [SequenceState.STOPPED] and stopped[0].end_reason == EndReason.STOP
    backend.apply([AbortSequence(1)])
    assert backend.num_live_sequences == 0
