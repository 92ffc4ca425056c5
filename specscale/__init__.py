"""SpecScale: serving PRM-guided test-time scaling with speculative beam search."""

import os

# OpenMP worker threads that spin while waiting make torch collapse (tens of times slower) as soon as
# another process competes for the cores, which a server shares with its HTTP side and neighbours;
# sleeping waits cost little on a quiet machine. Only effective if set before torch is first imported;
# an explicit OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
