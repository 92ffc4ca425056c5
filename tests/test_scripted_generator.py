"""The package's scripted generator keeps the backend seam's lane contract (runtime/backend.py): each lane of a
row writes the step its own lane seed scripts, and split rows say which lanes they hold."""

from scripted_generator import ScriptedGenerator, seeded_step
from specscale.seam import SamplingParams, SequenceState, StartSequence
from specscale.sim.clock import VirtualClock

PROMPT = (1, 2, 3)
PARAMS = SamplingParams(stop=("\n\n",))


def lane_tokens(generator: ScriptedGenerator, op: StartSequence) -> dict[int, list[int]]:
    generator.apply([op])
    lanes: dict[int, list[int]] = {}
    while generator.has_work():
        for update in generator.step():
            for lane in update.lane_ids:
                lanes.setdefault(lane, []).extend(update.new_token_ids)
    return lanes


def test_each_lane_writes_its_own_seeds_step_and_split_rows_carry_their_lanes():
    seeds = (7, 70, 700, 7000)
    generator = ScriptedGenerator(VirtualClock())
    row = lane_tokens(generator, StartSequence(0, PROMPT, PARAMS, multiplicity=4, split_ids=(1, 2, 3),
                                               lane_seeds=seeds))
    assert row == {j: seeded_step(PROMPT, seed, final=False) for j, seed in enumerate(seeds)}
    assert len({tuple(tokens) for tokens in row.values()}) > 1  # the row did split
    for j, seed in enumerate(seeds):
        assert lane_tokens(generator, StartSequence(10 + j, PROMPT, PARAMS, lane_seeds=(seed,))) == {0: row[j]}
    assert {s.state for s in generator.seqs.values()} == {SequenceState.STOPPED}


def test_without_lane_seeds_a_rows_lanes_take_consecutive_seeds_from_its_params():
    generator = ScriptedGenerator(VirtualClock())
    row = lane_tokens(generator, StartSequence(0, PROMPT, SamplingParams(seed=5, stop=("\n\n",)), multiplicity=3,
                                               split_ids=(1, 2)))
    assert row == {j: seeded_step(PROMPT, 5 + j, final=False) for j in range(3)}
