import dataclasses
import os
import sys
from pathlib import Path

# OpenMP threads that spin while waiting make torch ~50x slower whenever another process is busy on
# this 2-core machine; sleeping waits cost little when it is quiet. Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(2)

from checkpoints import build_checkpoint  # noqa: E402
from search_backends import scripted_backend, simulated_backend, toy_backend  # noqa: E402

from specscale.engine.engine import Engine  # noqa: E402
from specscale.engine.sequence import SequenceStatus  # noqa: E402


# SPECSCALE_TEST_DEVICE=cuda runs every engine the tests build on that device (the default is the CPU).
TEST_DEVICE = os.environ.get("SPECSCALE_TEST_DEVICE")


@pytest.fixture(scope="session")
def test_device() -> str:
    """Where the tests' engines run, for references that must run beside them."""
    return TEST_DEVICE or "cpu"


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("qwen2"), "qwen2")


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture(scope="session")
def toy_search_backend():
    backend, pipeline = toy_backend()
    yield backend
    pipeline.close()


@pytest.fixture(scope="session")
def simulated_search_backend():
    backend, sim = simulated_backend()
    yield backend
    sim.close()


@pytest.fixture(params=["scripted", "toy", "simulated"])
def search_backend(request):
    """The search and runtime suite's backend: scripted, the bundled toy models, or the simulator
    (tests/search_backends.py). Afterwards the PRM's cached prefixes are dropped."""
    backend = scripted_backend() if request.param == "scripted" else request.getfixturevalue(
        f"{request.param}_search_backend")
    yield backend
    backend.release()


@pytest.fixture(autouse=True)
def no_leaked_blocks(monkeypatch):
    """Every engine a test creates must end with no sequence holding KV blocks, except a PRM
    verifier's cached prefixes (paused prefill-only sequences that `Verifier.clear()` releases)."""
    created: list[Engine] = []
    original = Engine.__init__

    def tracking_init(self, config, **kwargs):
        if TEST_DEVICE and kwargs.get("runner") is None:  # a simulated runner lives on the CPU
            config = dataclasses.replace(config, device=TEST_DEVICE)
        original(self, config, **kwargs)
        created.append(self)

    monkeypatch.setattr(Engine, "__init__", tracking_init)
    yield
    for engine in created:
        engine.block_manager.check_invariants(engine.scheduler.sequences.values())
        leaked = [s for s in engine.scheduler.sequences.values()
                  if s.block_table and not (s.is_readout and s.status == SequenceStatus.PAUSED)]
        assert not leaked, f"{len(leaked)} sequences still hold KV blocks after the test"
