import os
import sys
from pathlib import Path

# OpenMP threads that spin while waiting make torch ~50x slower whenever another process is busy on
# this 2-core machine; sleeping waits cost little when it is quiet. Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# a decode or PRM profile this machine's user measured (`specscale profile-decode`, `profile-prm`) would change
# the engines' row budget and the LV threshold: the tests read profiles only from folders of their own (empty
# unless a test writes one), as on a fresh CI machine
for variable, kind in (("SPECSCALE_DECODE_PROFILE_DIR", "decode"), ("SPECSCALE_PRM_PROFILE_DIR", "prm")):
    os.environ[variable] = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"specscale-test-{kind}-profiles-{os.getpid()}")

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(2)

from checkpoints import build_checkpoint  # noqa: E402

# every engine the tests build, at any fixture scope, is checked for leaked KV blocks after each test and
# runs on SPECSCALE_TEST_DEVICE (default: the CPU): tests/kv_leak_guard.py
from kv_leak_guard import TEST_DEVICE, no_leaked_blocks  # noqa: E402, F401
from search_backends import scripted_backend, simulated_backend, toy_backend  # noqa: E402


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
