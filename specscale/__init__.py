"""SpecScale: serving PRM-guided test-time scaling with speculative beam search."""

import os

# OpenMP worker threads that spin while waiting make torch collapse (tens of times slower) as soon as
# another process competes for the cores, which a server shares with its HTTP side and neighbours;
# sleeping waits cost little on a quiet machine. Only effective if set before torch is first imported;
# an explicit OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# torch's CPU allocator puts every allocation of 2 MB or more on transparent huge pages (2 MB-aligned,
# madvise'd): decode streams every weight once per step, and with 4 KB pages the TLB misses cost ~5-10% of a
# 0.5B model's batch-32 step (docs/bench/real-size.md). Read by torch at its first
# allocation, so only effective before torch is imported; an explicit value in the environment wins.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__version__ = "0.1.0"
