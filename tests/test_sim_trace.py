"""Traces: JSONL round trips, version checks, recording simulated runs (the same seed gives the same run,
request by request), and fitting the workload back from a recorded trace."""

import json

import pytest

from specscale.search.presets import preset_config
from specscale.sim.simulation import Simulation, SimulationConfig
from specscale.sim.workload import preset
from specscale_lab.calibration.trace import (
    TraceHeader,
    TraceRequest,
    TraceStep,
    common_prefix_ratio,
    fit_workload,
    mann_whitney_auc,
    read_trace,
    split_steps,
    trace_request,
    write_trace,
)

MATH = preset("math500", "qwen2.5-7b-instruct", "qwen2.5-math-prm-7b")


def simulated_trace(seed: int, variant: str = "best-of-n", problems: int = 24, beam_size: int = 4):
    """Run `problems` requests on the simulated A100 and record them; returns (trace requests, (simulated
    seconds, each result's answer, usage, timings and step scores))."""
    sim = Simulation(SimulationConfig(seed=seed))
    runtime = sim.runtime(max_concurrency=16)
    chosen = sim.problems(problems)
    requests = [sim.request(p, preset_config(variant, beam_size=beam_size, beam_width=4, seed=seed * 1000 + i),
                            f"q{i}") for i, p in enumerate(chosen)]
    results = runtime.run(requests)
    traces = [trace_request(r.request_id, runtime.search(r.request_id), p.question, len(p.prompt_ids),
                            sim.tokenizer, p.answer) for r, p in zip(requests, chosen, strict=True)]
    outcome = (sim.clock(), [(r.answer, r.usage, r.timings, [p.step_scores for p in r.paths]) for r in results])
    assert sim.engine.block_manager.num_free_blocks == sim.engine.block_manager.num_blocks
    sim.close()
    return traces, outcome


def test_a_trace_round_trips_through_its_file(tmp_path):
    header = TraceHeader("qwen2.5-7b-instruct", "qwen2.5-math-prm-7b", 0.8, {"beam_size": 4}, "real", "note")
    steps = (TraceStep(0, None, 0, (12,), (0.5,), token_ids=tuple(range(12))),
             TraceStep(1, 0, 1, (7, 9), (1.0, 0.25), multiplicity=2, completed=True, answer="3", correct=True))
    requests = [TraceRequest("r0", "What is 1 + 2?", 8, 40, "3", "3", True, steps)]
    path = tmp_path / "trace.jsonl"
    write_trace(path, header, requests)
    assert read_trace(path) == (header, requests)
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["format"] == "specscale-trace" and json.loads(lines[0])["version"] == 1
    path.write_text(lines[0].replace('"version": 1', '"version": 99') + "\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match="version 99"):
        read_trace(path)
    path.write_text(lines[0] + "\n" + '{"request_id": "r1"}\n')
    with pytest.raises(ValueError, match=":2: not a trace request"):
        read_trace(path)


@pytest.mark.parametrize("variant", ["beam", "specscale"])
def test_the_same_seed_gives_the_same_run_request_by_request(variant):
    first, outcome = simulated_trace(seed=5, variant=variant, problems=4)
    again, outcome_again = simulated_trace(seed=5, variant=variant, problems=4)
    assert first == again and outcome == outcome_again  # every step, score, token count, timing and the clock
    other, _ = simulated_trace(seed=6, variant=variant, problems=4)
    assert other != first


def test_the_workload_fitted_from_a_recorded_trace_is_the_one_simulated(tmp_path):
    requests, _ = simulated_trace(seed=1, problems=32)
    path = tmp_path / "sim.jsonl"
    write_trace(path, TraceHeader("qwen2.5-7b-instruct", "qwen2.5-math-prm-7b", 0.8, source="simulated"), requests)
    _, read_back = read_trace(path)
    fitted = fit_workload(read_back, MATH)
    assert fitted == fit_workload(requests, MATH)
    assert fitted.step_tokens_median == pytest.approx(MATH.step_tokens_median, rel=0.12)
    assert fitted.step_tokens_sigma == pytest.approx(MATH.step_tokens_sigma, abs=0.07)
    assert fitted.accuracy == pytest.approx(MATH.accuracy, abs=0.13)  # 128 unselected samples
    assert fitted.prm.perfect_share_sound == pytest.approx(MATH.prm.perfect_share_sound, abs=0.07)
    assert fitted.prm.sound_logit_mean == pytest.approx(MATH.prm.sound_logit_mean, abs=0.4)
    assert "fitted from a trace of 32 requests" in fitted.sources["step_tokens_median"]
    # every completed best-of-N sample holds a whole solution: steps per solution come from its pieces
    assert fitted.steps_median == pytest.approx(MATH.steps_median, rel=0.3)


def test_helpers():
    assert split_steps(" o1 w2\n\n o3\n\n Therefore \\boxed{2}") == [" o1 w2\n\n", " o3\n\n", " Therefore \\boxed{2}"]
    assert split_steps(" o1\n\n") == [" o1\n\n"]
    assert mann_whitney_auc([2, 3], [1, 2]) == pytest.approx((1 + 1 + 0.5 + 1) / 4)
    group = [(1, 2, 3), (1, 2, 4), (1, 5)]  # trie nodes 1, 12, 123, 124, 15: 5 of 8 tokens
    steps = tuple(TraceStep(i, 0, 1, (len(t),), (), token_ids=t) for i, t in enumerate(group))
    assert common_prefix_ratio([TraceRequest("r", "q", 1, 1, None, None, None, steps)]) == pytest.approx(3 / 8)
