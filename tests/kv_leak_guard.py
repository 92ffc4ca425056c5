"""The suite's KV-leak guard and test device (imported by conftest.py; tests/test_kv_leak_guard.py checks it).

`Engine.__init__` is wrapped once, when this module is imported, so that *every* engine the tests build —
inside a test, or in a module- or session-scoped fixture, or at import time — is registered and, with
SPECSCALE_TEST_DEVICE=cuda, built on that device. After each test the autouse `no_leaked_blocks` checks
every registered engine still alive: no sequence may hold KV blocks, except a PRM verifier's cached
prefixes (paused prefill-only sequences that `Verifier.clear()` releases), and the block manager's
invariants must hold. An engine found leaking is reported once (then dropped from the registry), so one
leak fails one test rather than every test after it.
"""

from __future__ import annotations

import dataclasses
import os
import weakref

import pytest

from specscale.engine.engine import Engine
from specscale.engine.sequence import SequenceStatus

TEST_DEVICE = os.environ.get("SPECSCALE_TEST_DEVICE")  # None: the engines' own device (the CPU)
ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()
_ORIGINAL_INIT = Engine.__init__


def _tracking_init(self, config, runner=None, tokenizer=None):
    if TEST_DEVICE and runner is None:  # a simulated runner lives on the CPU
        config = dataclasses.replace(config, device=TEST_DEVICE)
    _ORIGINAL_INIT(self, config, runner=runner, tokenizer=tokenizer)
    ENGINES.add(self)


if Engine.__init__ is _ORIGINAL_INIT:  # once, however often this module is imported
    Engine.__init__ = _tracking_init


def leaks(engine: Engine) -> list:
    """The engine's sequences holding KV blocks that should not (after checking its block invariants)."""
    sequences = engine.scheduler.sequences.values()
    engine.block_manager.check_invariants(sequences)
    return [s for s in sequences if s.block_table and not (s.is_readout and s.status == SequenceStatus.PAUSED)]


@pytest.fixture(autouse=True)
def no_leaked_blocks():
    """Every engine alive after the test, wherever it was built, holds no leaked KV block."""
    yield
    leaking = {engine: found for engine in list(ENGINES) if (found := leaks(engine))}
    for engine in leaking:
        ENGINES.discard(engine)
    assert not leaking, "; ".join(f"an engine ({engine.config.device}) still has {len(found)} sequences holding KV "
                                  f"blocks after the test" for engine, found in leaking.items())
