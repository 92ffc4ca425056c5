"""Preemption under KV pressure: victims are chosen so that their blocks really return to the pool."""

from specscale.engine.block_manager import BlockManager
from specscale.engine.scheduler import Scheduler
from specscale.engine.sequence import Sequence, SequenceStatus

BS = 4


def computed(bm, seq_id, tokens, priority=0, status=SequenceStatus.PAUSED):
    """A sequence whose tokens all have KV, as after a finished generation segment."""
    seq = Sequence(seq_id=seq_id, token_ids=list(tokens), params=None, arrival=seq_id, priority=priority)
    bm.allocate_slots(seq, len(tokens))
    seq.num_computed_tokens = len(tokens)
    seq.status = status
    return seq


def forked(bm, parent, seq_id, priority):
    """A child that shares parent's blocks and has one new token to compute."""
    child = Sequence(seq_id=seq_id, token_ids=parent.token_ids + [7], params=None, arrival=seq_id, priority=priority)
    bm.fork(parent, child)
    child.status = SequenceStatus.RUNNING
    return child


def scheduler_with(bm, *seqs):
    scheduler = Scheduler(bm, max_num_batched_tokens=64, max_num_seqs=8)
    for seq in seqs:
        scheduler.add(seq)
    return scheduler


def test_forks_sharing_every_block_are_preempted_together_with_their_paused_parent():
    bm = BlockManager(num_blocks=4, block_size=BS)
    parent = computed(bm, 0, range(8))  # 2 full blocks, paused between steps
    children = [forked(bm, parent, 1, priority=-1), forked(bm, parent, 2, priority=-1)]  # share both blocks
    newcomer = Sequence(seq_id=5, token_ids=list(range(12)), params=None, arrival=5)  # needs 3 blocks, 2 are free
    scheduler = scheduler_with(bm, parent, *children, newcomer)
    batch = scheduler.schedule()
    assert [row.seq for row in batch.rows] == [newcomer]  # no child alone frees a block; the group does
    assert all(not seq.block_table for seq in [parent, *children]) and scheduler.num_preemptions == 3
    bm.check_invariants(scheduler.sequences.values())


def test_a_sequence_whose_blocks_stay_held_elsewhere_is_not_preempted():
    bm = BlockManager(num_blocks=5, block_size=BS)
    running_parent = computed(bm, 0, range(8), priority=1, status=SequenceStatus.RUNNING)
    loner = computed(bm, 1, range(100, 108), priority=-1)  # 2 blocks of its own
    sharer = forked(bm, running_parent, 2, priority=-1)  # newer, so asked first; holds only shared blocks
    newcomer = Sequence(seq_id=5, token_ids=list(range(12)), params=None, arrival=5)  # needs 3, 1 is free
    scheduler = scheduler_with(bm, running_parent, sharer, loner, newcomer)
    assert [row.seq for row in scheduler.schedule().rows] == [newcomer]
    assert sharer.block_table and not loner.block_table and scheduler.num_preemptions == 1


def test_no_preemption_when_even_every_candidate_would_not_free_enough():
    bm = BlockManager(num_blocks=4, block_size=BS)
    running = computed(bm, 0, range(12), priority=1, status=SequenceStatus.RUNNING)  # 3 blocks
    small = computed(bm, 1, range(100, 104), priority=-1)  # 1 block
    newcomer = Sequence(seq_id=5, token_ids=list(range(200, 212)), params=None, arrival=5)  # needs 3, 0 free
    scheduler = scheduler_with(bm, running, small, newcomer)
    assert scheduler.schedule().is_empty
    assert small.block_table and scheduler.num_preemptions == 0  # nothing preempted in vain



def test_speculative_rows_count_as_work_only_where_the_row_budget_leaves_them_room():
    """The runtime flushes the verify queue when the generator has nothing to run (SPEC 3.3, trigger 4): a
    speculative sequence the row budget will not schedule must not keep it stepping on empty iterations."""
    bm = BlockManager(num_blocks=8, block_size=BS)
    waiting = Sequence(seq_id=1, token_ids=list(range(6)), params=None, arrival=1, priority=-100)
    no_room = Scheduler(bm, max_num_batched_tokens=64, max_num_seqs=8, spare_rows=0)
    no_room.add(waiting)
    assert no_room.schedule().is_empty and not no_room.has_work()
    room = Scheduler(bm, max_num_batched_tokens=64, max_num_seqs=8, spare_rows=1)
    room.add(waiting)
    assert room.has_work() and len(room.schedule().rows) == 1
    bm.free(waiting)
    real = Sequence(seq_id=2, token_ids=list(range(6)), params=None, arrival=2)
    no_room.add(real)
    assert no_room.has_work() and [r.seq for r in no_room.schedule().rows] == [real]
    bm.free(real)
