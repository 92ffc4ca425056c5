"""The simulator end to end: the real SearchRuntime, Search, verification queue, scheduler and block manager
serve `beam` and `specscale` requests on simulated models and a virtual clock; every KV block comes back,
a small KV pool preempts and still finishes (same seed, same run: tests/test_sim_trace.py), and
`bench/runs.py`'s runtime builder and batch loop run on a `Simulation` as on a `Pipeline`."""

import time

import pytest

from specscale.engine.engine import Engine
from specscale.search.presets import preset_config
from specscale.sim.runner import SimulatedRunner
from specscale.sim.simulation import Simulation, SimulationConfig
from specscale_lab.bench.runs import fresh_runtime, run_batch


def serve(config: SimulationConfig, variant: str, problems: int = 6, beam_size: int = 4):
    """(results, simulated seconds, simulation) of `problems` requests issued at once."""
    sim = Simulation(config)
    runtime = sim.runtime(max_concurrency=8)
    requests = [sim.request(p, preset_config(variant, beam_size=beam_size, seed=i), f"{variant}-{i}")
                for i, p in enumerate(sim.problems(problems))]
    results = runtime.run(requests)
    return results, sim.clock(), sim


@pytest.mark.parametrize("variant", ["beam", "specscale"])
def test_searches_run_on_the_simulated_backend_and_free_every_block(variant):
    started = time.perf_counter()
    results, simulated_s, sim = serve(SimulationConfig(seed=0), variant)
    wall_s = time.perf_counter() - started
    assert isinstance(sim.engine, Engine) and isinstance(sim.engine.runner, SimulatedRunner)
    assert all(r.error is None and r.answer is not None and r.paths for r in results)
    assert sum(r.answer == p.answer for r, p in zip(results, sim.problems(6), strict=True)) >= 3  # a 75%-accurate generator
    assert simulated_s == pytest.approx(sim.engine.runner.busy_s + sim.verifier.engine.runner.busy_s)
    manager = sim.engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks and sim.engine.num_live_sequences == 0
    sim.verifier.clear()
    assert sim.verifier.engine.block_manager.num_used_blocks == 0
    tokens = sum(r.usage.generated_tokens for r in results)
    print(f"\n{variant}: {simulated_s:.1f} simulated s in {wall_s:.1f} wall s ({simulated_s / wall_s:.1f}x), "
          f"{tokens / wall_s:,.0f} generated tokens per wall s")
    sim.close()


def test_a_small_kv_pool_preempts_and_still_finishes():
    config = SimulationConfig(seed=0, generator_kv_blocks=350)
    results, _, sim = serve(config, "naive-spec", problems=3, beam_size=8)
    assert sim.engine.scheduler.num_preemptions > 0
    assert all(r.error is None and r.paths for r in results)
    assert sim.engine.block_manager.num_free_blocks == 350
    sim.close()


def test_the_bench_plumbing_runs_on_a_simulation_on_its_clock():
    sim = Simulation(SimulationConfig(seed=0))
    requests = [sim.request(p, preset_config("specscale", beam_size=4, seed=i), f"q{i}")
                for i, p in enumerate(sim.problems(4))]
    batch = run_batch(fresh_runtime(sim, max_concurrency=4), requests)
    assert all(r.error is None and r.paths for r in batch.results)
    assert sim.clock() > 0 and batch.elapsed_s == pytest.approx(sim.clock())  # simulated seconds, not wall
    assert batch.runtime.stats().live_sequences == 0


def test_a_fresh_runtime_takes_no_kv_an_earlier_run_left_in_the_engines_prefix_caches():
    """The bench runs every cell on one stack: a later cell must compute its questions' PRM and generator KV
    as the first one did (the PRM computed ~11% fewer tokens on a CPU ladder's later cells before)."""
    sim = Simulation(SimulationConfig(seed=0))
    requests = [sim.request(p, preset_config("beam", beam_size=4, seed=i), f"q{i}") for i, p in enumerate(sim.problems(4))]
    computed = []
    for _ in range(2):
        before = sim.verifier.stats.computed_tokens, sim.engine.block_manager.num_cache_hit_tokens
        run_batch(fresh_runtime(sim, max_concurrency=4), requests)
        after = sim.verifier.stats.computed_tokens, sim.engine.block_manager.num_cache_hit_tokens
        computed.append((after[0] - before[0], after[1] - before[1]))
    assert computed[0][0] > 0 and computed[1] == computed[0]


@pytest.mark.timeout(120)
def test_a_pool_barely_larger_than_the_shared_prefixes_does_not_livelock():
    """150 blocks: every running sequence shares all its blocks with a paused parent, so only groups can
    be preempted; the old scheduler preempted sequences that freed nothing and spun forever."""
    results, _, sim = serve(SimulationConfig(seed=0, generator_kv_blocks=150), "naive-spec", problems=3, beam_size=8)
    assert all(r.error is None and r.paths for r in results)
    assert sim.engine.block_manager.num_free_blocks == 150
    sim.close()
