"""Reference-counted KV blocks: allocate, fork (share), copy-on-write, free, automatic prefix caching.

Invariants (checked by `check_invariants` in tests after every operation):
- ref_count[b] equals the number of live block tables that hold block b;
- the free list holds exactly the blocks with ref_count 0, each once; free and used are disjoint and
  together are all blocks (no block is lost);
- a block in the prefix cache holds a full, computed block of tokens whose chain hash is its key.

A free block keeps its content hash, so a later sequence with the same prefix can take it back out of
the free list (a prefix-cache hit); it loses the hash only when it is reused for other content.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from specscale.engine.sequence import Sequence
from specscale.seam import KVUsage


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # chain hash -> block id
        self.free_list: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))  # LRU first
        self.num_cache_hit_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_list)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_list)

    @property
    def usage(self) -> KVUsage:
        return KVUsage(self.num_used_blocks, self.num_blocks)

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """New blocks (copy-on-write included) to give seq KV slots for num_new_tokens more tokens."""
        end = seq.num_computed_tokens + num_new_tokens
        needed = -(-end // self.block_size) - len(seq.block_table)
        return max(needed, 0) + int(self._needs_copy_on_write(seq))

    def allocate_cached_prefix(self, seq: Sequence) -> int:
        """For a sequence without blocks: take the cached full blocks of its prefix; returns tokens covered.

        The last token, and every readout position, are left to compute so the forward pass yields them.
        """
        assert not seq.block_table and seq.num_computed_tokens == 0
        if not self.enable_prefix_caching:
            return 0
        bs = self.block_size
        parent = None
        reusable = len(seq.token_ids) - 1  # the last token is computed for its logits
        if seq.readout_positions:  # and every position to read out must be computed too
            reusable = min(reusable, min(seq.readout_positions))
        for i in range(reusable // bs):
            key = chain_hash(parent, seq.token_ids[i * bs : (i + 1) * bs])
            block = self.cached.get(key)
            if block is None:
                break
            self._take(block)
            seq.block_table.append(block)
            parent = key
        covered = len(seq.block_table) * bs
        seq.num_hashed_blocks = len(seq.block_table)
        seq.num_computed_tokens = covered
        self.num_cache_hit_tokens += covered
        return covered

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Give seq slots for its next num_new_tokens; returns block copies (src, dst) to run first.

        The caller checks `blocks_needed` against `num_free_blocks` before calling.
        """
        copies = []
        if self._needs_copy_on_write(seq):
            index = len(seq.block_table) - 1
            shared = seq.block_table[index]
            fresh = self._pop_free()
            self._release(shared)
            seq.block_table[index] = fresh
            copies.append((shared, fresh))
        end = seq.num_computed_tokens + num_new_tokens
        while len(seq.block_table) * self.block_size < end:
            seq.block_table.append(self._pop_free())
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares every block of parent; nothing is copied until one of them writes a shared block."""
        child.block_table = list(parent.block_table)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_hashed_blocks = parent.num_hashed_blocks
        for block in child.block_table:
            self.ref_count[block] += 1

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks; blocks other sequences still reference stay."""
        for block in reversed(seq.block_table):  # tail first: the prefix stays cached longest
            self._release(block)
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_hashed_blocks = 0

    def register_computed_blocks(self, seq: Sequence) -> None:
        """Enter seq's newly completed full blocks into the prefix cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = seq.num_computed_tokens // bs
        if full <= seq.num_hashed_blocks:  # no block completed since the last call (most decode steps)
            return
        for i in range(seq.num_hashed_blocks, full):
            block = seq.block_table[i]
            if self.block_hash[block] is None:
                parent = self.block_hash[seq.block_table[i - 1]] if i else None
                key = chain_hash(parent, seq.token_ids[i * bs : (i + 1) * bs])
                self.block_hash[block] = key
                self.cached.setdefault(key, block)
        seq.num_hashed_blocks = max(full, seq.num_hashed_blocks)

    def forget_free_prefixes(self) -> int:
        """Drop the prefix-cache entries of free blocks (blocks in use keep theirs); returns how many were
        dropped. A benchmark calls it between runs, so no run takes KV another run computed."""
        dropped = 0
        for block in self.free_list:
            key = self.block_hash[block]
            if key is not None:
                if self.cached.get(key) == block:
                    del self.cached[key]
                self.block_hash[block] = None
                dropped += 1
        return dropped

    def check_invariants(self, sequences: Iterable[Sequence]) -> None:
        holders = [0] * self.num_blocks
        for seq in sequences:
            for block in seq.block_table:
                holders[block] += 1
        assert holders == self.ref_count, "reference counts differ from block-table holders"
        free = set(self.free_list)
        assert len(free) == len(self.free_list), "a block is twice in the free list"
        used = {b for b, count in enumerate(self.ref_count) if count > 0}
        assert free.isdisjoint(used), "a block is both free and used"
        assert len(free) + len(used) == self.num_blocks, "a block is lost"
        for key, block in self.cached.items():
            assert self.block_hash[block] == key, "prefix cache entry points at a block with other content"

    def _needs_copy_on_write(self, seq: Sequence) -> bool:
        # The next write lands in the last block when it is partly filled; copy it if others share it.
        if seq.num_computed_tokens % self.block_size == 0 or not seq.block_table:
            return False
        if len(seq.block_table) * self.block_size <= seq.num_computed_tokens:
            return False
        return self.ref_count[seq.block_table[-1]] > 1

    def _pop_free(self) -> int:
        block, _ = self.free_list.popitem(last=False)
        key = self.block_hash[block]
        if key is not None:  # reused for new content: it leaves the prefix cache
            if self.cached.get(key) == block:
                del self.cached[key]
            self.block_hash[block] = None
        self.ref_count[block] = 1
        return block

    def _take(self, block: int) -> None:
        if self.ref_count[block] == 0:
            del self.free_list[block]
        self.ref_count[block] += 1

    def _release(self, block: int) -> None:
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self.free_list[block] = None


def chain_hash(parent: int | None, tokens: list[int]) -> int:
    """Content hash of a full block that also covers every block before it."""
    return hash((parent, tuple(tokens)))
