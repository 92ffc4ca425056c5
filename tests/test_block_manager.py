"""Reference-counted blocks: fork shares, copy-on-write, free, prefix cache; invariants after every operation."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from specscale.engine.block_manager import BlockManager
from specscale.engine.sequence import Sequence

BS = 4


def new_seq(seq_id, tokens):
    return Sequence(seq_id=seq_id, token_ids=list(tokens), params=None, arrival=seq_id)


def compute(bm, seq, n):
    """What an engine iteration does for seq: slots for n tokens, then mark them computed."""
    copies = bm.allocate_slots(seq, n)
    seq.num_computed_tokens += n
    bm.register_computed_blocks(seq)
    return copies


def test_fork_shares_blocks_and_first_append_copies_partial_block():
    bm = BlockManager(16, BS)
    parent = new_seq(0, range(10))
    compute(bm, parent, 10)  # blocks: 2 full + 1 partial (2 tokens)
    child = new_seq(1, range(10))
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    assert all(bm.ref_count[b] == 2 for b in parent.block_table)
    child.token_ids.append(99)
    copies = compute(bm, child, 1)
    assert copies == [(parent.block_table[2], child.block_table[2])]  # only the shared partial block
    assert child.block_table[:2] == parent.block_table[:2]
    assert bm.ref_count[parent.block_table[2]] == 1
    parent.token_ids.append(7)
    assert compute(bm, parent, 1) == []  # parent now owns its partial block alone: no copy
    bm.check_invariants([parent, child])


def test_free_releases_only_unshared_blocks():
    bm = BlockManager(16, BS)
    a = new_seq(0, range(8))
    compute(bm, a, 8)
    b = new_seq(1, range(8))
    bm.fork(a, b)
    bm.free(a)
    assert bm.num_used_blocks == 2 and all(bm.ref_count[x] == 1 for x in b.block_table)
    bm.free(b)
    assert bm.num_used_blocks == 0
    bm.check_invariants([])


def test_prefix_cache_hit_skips_cached_full_blocks():
    bm = BlockManager(16, BS)
    a = new_seq(0, range(11))
    compute(bm, a, 11)
    bm.free(a)  # blocks go to the free list but keep their content hashes
    b = new_seq(1, list(range(11)) + [50, 51])
    covered = bm.allocate_cached_prefix(b)
    assert covered == 8  # two full blocks; the partial third block is not cached
    c = new_seq(2, list(range(8)))
    assert bm.allocate_cached_prefix(c) == 4  # one token must stay to be computed
    bm.check_invariants([b, c])


def test_forgetting_free_prefixes_drops_the_free_blocks_hashes_and_keeps_the_live_ones():
    bm = BlockManager(16, BS)
    a, live = new_seq(0, range(9)), new_seq(1, [7] * 9)
    compute(bm, a, 9)
    compute(bm, live, 9)
    bm.free(a)
    assert bm.forget_free_prefixes() == 2  # a's two full blocks; its partial block never had a hash
    assert bm.allocate_cached_prefix(new_seq(2, list(range(9)))) == 0
    again = new_seq(3, [7] * 9)
    assert bm.allocate_cached_prefix(again) == 8  # the live sequence's full blocks are still shared
    bm.check_invariants([live, again])


def test_reused_free_block_leaves_prefix_cache():
    bm = BlockManager(2, BS)
    a = new_seq(0, range(8))
    compute(bm, a, 8)
    bm.free(a)
    b = new_seq(1, [9] * 8)
    compute(bm, b, 8)  # takes both blocks: their old hashes must be forgotten
    c = new_seq(2, list(range(8)) + [1])
    assert bm.allocate_cached_prefix(c) == 0
    bm.check_invariants([b])


class BlockMachine(RuleBasedStateMachine):
    """Random allocate / fork / append / free / abort sequences; invariants after every step."""

    def __init__(self):
        super().__init__()
        self.bm = BlockManager(24, BS)
        self.storage = [[None] * BS for _ in range(24)]  # simulated KV content: the token in each slot
        self.live: dict[int, Sequence] = {}
        self.next_id = 0

    def _fits(self, seq, n):
        return self.bm.blocks_needed(seq, n) <= self.bm.num_free_blocks

    def _compute(self, seq, n):
        start = seq.num_computed_tokens
        copies = compute(self.bm, seq, n)
        for src, dst in copies:
            self.storage[dst] = list(self.storage[src])
        for p in range(start, start + n):  # the forward pass writes each new token's KV
            self.storage[seq.block_table[p // BS]][p % BS] = seq.token_ids[p]
        return copies

    @rule(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=20))
    def allocate(self, tokens):
        seq = new_seq(self.next_id, tokens)
        self.next_id += 1
        self.bm.allocate_cached_prefix(seq)
        n = seq.num_uncomputed_tokens
        if self._fits(seq, n):
            self._compute(seq, n)
            self.live[seq.seq_id] = seq
        else:
            self.bm.free(seq)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), n=st.integers(1, 3))
    def fork(self, data, n):
        parent = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        for _ in range(n):
            child = new_seq(self.next_id, parent.token_ids)
            self.next_id += 1
            self.bm.fork(parent, child)
            self.live[child.seq_id] = child

    @precondition(lambda self: self.live)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 3), min_size=1, max_size=6))
    def append(self, data, tokens):
        seq = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        if self._fits(seq, len(tokens)):
            seq.token_ids += tokens
            before = [b for b in seq.block_table]
            copies = self._compute(seq, len(tokens))
            for src, dst in copies:  # a copy replaces exactly the shared partial block
                assert src in before and dst in seq.block_table

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        seq = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        self.bm.free(seq)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort_all_forks_of_one(self, data):
        victim = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        for seq_id in [s for s, q in self.live.items() if q.token_ids == victim.token_ids]:
            self.bm.free(self.live.pop(seq_id))

    @invariant()
    def blocks_consistent(self):
        self.bm.check_invariants(self.live.values())

    @invariant()
    def every_sequence_reads_its_own_tokens(self):
        # Sharing, copy-on-write and prefix-cache hits must never let one sequence see another's KV.
        for seq in self.live.values():
            content = [self.storage[seq.block_table[p // BS]][p % BS] for p in range(seq.num_computed_tokens)]
            assert content == seq.token_ids[: seq.num_computed_tokens]

    def teardown(self):
        for seq in self.live.values():
            self.bm.free(seq)
        self.bm.check_invariants([])
        assert self.bm.num_used_blocks == 0


TestBlockMachine = BlockMachine.TestCase
TestBlockMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
