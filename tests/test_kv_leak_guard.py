"""The suite's KV-leak guard (tests/kv_leak_guard.py) covers every engine a test touches, whatever the
scope of the fixture that built it, and SPECSCALE_TEST_DEVICE reaches those engines too. Each check runs
a small test file of its own in a pytest subprocess (pytester) with the guard as its conftest."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent
GUARD_CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from kv_leak_guard import no_leaked_blocks  # noqa: F401
"""

PLANTED_LEAK = """
import os
import pytest
from engine_helpers import make_engine
from specscale.seam import SamplingParams

@pytest.fixture(scope="module")
def shared_engine():
    return make_engine(os.environ["LEAK_GUARD_CHECKPOINT"])

def test_a_search_that_forgets_its_sequence(shared_engine):
    shared_engine.add([5, 17, 42, 99, 120, 7], SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True))
    shared_engine.step()  # prefilled: the sequence holds KV blocks, and the test never aborts it

def test_a_clean_test_after_it(shared_engine):
    assert shared_engine is not None
"""


def test_a_leak_in_a_module_scoped_engine_fails_the_test_that_made_it(pytester, qwen2_dir, monkeypatch):
    monkeypatch.setenv("LEAK_GUARD_CHECKPOINT", str(qwen2_dir))
    pytester.makeconftest(GUARD_CONFTEST)
    pytester.makepyfile(test_planted=PLANTED_LEAK)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)  # the leaking test errors at teardown, once; the next one passes
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_a_search_that_forgets_its_sequence*",
                                 "*1 sequences holding KV blocks after the test*"])


DEVICE_CONFTEST = GUARD_CONFTEST.replace("from kv_leak_guard", """
from types import SimpleNamespace
from specscale.engine.engine import Engine

def recording_init(self, config, runner=None, tokenizer=None):  # no model: only where it would be built
    self.config = config
    self.scheduler = SimpleNamespace(sequences={})
    self.block_manager = SimpleNamespace(check_invariants=lambda sequences: None)

Engine.__init__ = recording_init
from kv_leak_guard""")

DEVICE_CHECK = """
import pytest
from specscale.config import EngineConfig
from specscale.engine.engine import Engine

@pytest.fixture(scope="session")
def session_engine():
    return Engine(EngineConfig(model="unused"))

@pytest.fixture(scope="module")
def module_engine():
    return Engine(EngineConfig(model="unused"))

def test_fixture_engines_are_built_on_the_test_device(session_engine, module_engine):
    assert session_engine.config.device == module_engine.config.device == "cuda"
    assert Engine(EngineConfig(model="unused")).config.device == "cuda"
"""


def test_the_test_device_reaches_engines_built_by_module_and_session_fixtures(pytester, monkeypatch):
    monkeypatch.setenv("SPECSCALE_TEST_DEVICE", "cuda")
    pytester.makeconftest(DEVICE_CONFTEST)
    pytester.makepyfile(test_device=DEVICE_CHECK)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
