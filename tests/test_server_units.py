"""The server's parts without HTTP: the engine loop on the scripted backend (results, progress, bounded
admission, engine failure, shutdown), request building, response ordering, metrics, and that a checkpoint's
code is never executed."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from functools import partial
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from checkpoints import build_stepping_generator, build_tokenizer
from search_backends import scripted_runtime
from specscale.runtime.runtime import SearchRequest
from specscale.search.presets import preset_config
from specscale.search.result import CompletedPath, SearchResult
from specscale.server.engine_loop import EngineLoop, Outcome, Refusal, RoundProgress
from specscale.server.errors import APIError
from specscale.server.metrics import Histogram, RequestOutcome, ServerMetrics, TokenRate
from specscale.server.protocol import ChatCompletionRequest
from specscale.server.request_body import field_path
from specscale.server.responses import ranked_paths
from specscale.server.search_builder import SearchBuilder
from specscale.server.settings import ServerSettings
from specscale.tokenizer import Tokenizer

# ---- the engine loop on the scripted backend ---------------------------------------------------------------
scripted = partial(scripted_runtime, 4)  # what EngineLoop builds its runtime with: (callbacks, options) -> runtime


def search_request(i: int, preset: str = "beam") -> SearchRequest:
    config = preset_config(preset, beam_size=8, beam_width=4, max_rounds=6, seed=i)
    return SearchRequest(f"question {i}", [1, 2, 3, i], config, f"r{i}")


async def drain(handle) -> tuple[list[RoundProgress], Outcome]:
    progress = []
    while True:
        event = await asyncio.wait_for(handle.events.get(), timeout=30)
        if isinstance(event, Outcome):
            return progress, event
        progress.append(event)


def test_engine_loop_answers_searches_with_progress_and_frees_everything():
    async def main():
        loop = EngineLoop(scripted, ServerMetrics(), max_waiting=8)
        loop.start()
        handles = [loop.submit(search_request(i), "beam", wants_progress=i == 0) for i in range(6)]
        drained = [await drain(h) for h in handles]
        loop.stop()
        return loop, drained

    loop, drained = asyncio.run(main())
    for i, (progress, outcome) in enumerate(drained):
        assert outcome.failure is None and outcome.result.error is None and outcome.result.paths
        assert bool(progress) == (i == 0)  # only the request that asked for progress gets it
    assert [p.round for p in drained[0][0]] == sorted(p.round for p in drained[0][0])
    assert loop.snapshot.running == 0 and loop.snapshot.kv_blocks_used == 0
    assert loop.snapshot.kv_blocks_total == 1000 and loop.snapshot.prm_kv_blocks_total == 10
    assert not loop.runtime.finished_ids()  # no history kept


def test_engine_loop_refuses_once_the_waiting_bound_is_reached():
    async def main():
        loop = EngineLoop(partial(scripted_runtime, 2), ServerMetrics(), max_waiting=3)
        answers = [loop.submit(search_request(i), "beam", wants_progress=False) for i in range(7)]
        assert loop.waiting() == 3  # 2 searches take the free slots; 3 wait, as many as the bound allows
        assert "3 searches waiting" in answers[-1].message
        loop.start()
        accepted = [a for a in answers if not isinstance(a, Refusal)]
        outcomes = [(await drain(h))[1] for h in accepted]
        loop.stop()
        return answers, outcomes

    answers, outcomes = asyncio.run(main())
    refusals = [a for a in answers if isinstance(a, Refusal)]
    assert len(refusals) == 2 and all(r.status == 429 and r.retry_after_s for r in refusals)
    assert all(o.result.error is None for o in outcomes)


def test_engine_failure_fails_open_requests_and_refuses_new_ones():
    async def main():
        loop = EngineLoop(scripted, ServerMetrics(), max_waiting=8)

        def broken_step():
            raise RuntimeError("kernel exploded")

        loop.runtime.step = broken_step
        loop.start()
        handle = loop.submit(search_request(0), "beam", wants_progress=False)
        _, outcome = await drain(handle)
        later = loop.submit(search_request(1), "beam", wants_progress=False)
        loop.stop()
        return outcome, later, loop

    outcome, later, loop = asyncio.run(main())
    assert outcome.result is None and "kernel exploded" in outcome.failure
    assert isinstance(later, Refusal) and later.status == 503
    assert loop.failure is not None


def gated_after_first_round(gate: threading.Event):
    """A runtime factory for EngineLoop: once a round has been decided, every tick waits for `gate`, so
    the search cannot finish before the test has acted (no race with a fast scripted backend)."""
    def make(on_round, **options):
        decided = threading.Event()

        def noting_round(request_id, decision):
            decided.set()
            on_round(request_id, decision)

        runtime = scripted(on_round=noting_round, **options)
        real_step = runtime.step

        def gated_step():
            if decided.is_set():
                assert gate.wait(timeout=30)
            return real_step()

        runtime.step = gated_step
        return runtime
    return make


def test_stopping_cancels_open_searches():
    async def main():
        gate = threading.Event()
        loop = EngineLoop(gated_after_first_round(gate), ServerMetrics(), max_waiting=8)
        loop.start()
        handle = loop.submit(search_request(0), "beam", wants_progress=True)
        await asyncio.wait_for(handle.events.get(), timeout=30)  # a round was decided: it is running
        stopper = threading.Thread(target=loop.stop)
        stopper.start()
        while loop.refusal() is None:  # the stop was requested
            await asyncio.sleep(0.001)
        gate.set()
        await asyncio.to_thread(stopper.join)
        _, outcome = await drain(handle)
        return outcome, loop

    outcome, loop = asyncio.run(main())
    assert outcome.result.error == "cancelled"
    assert loop.runtime.stats().live_sequences == 0


def test_cancel_records_its_delay_in_ticks():
    async def main():
        metrics = ServerMetrics()
        gate = threading.Event()
        loop = EngineLoop(gated_after_first_round(gate), metrics, max_waiting=8)
        handle = loop.submit(search_request(0), "beam", wants_progress=True)
        loop.start()
        await asyncio.wait_for(handle.events.get(), timeout=30)
        loop.cancel(handle.request_id, "disconnect")
        gate.set()
        _, outcome = await drain(handle)
        loop.stop()
        return outcome, metrics

    outcome, metrics = asyncio.run(main())
    assert outcome.result.error == "cancelled"
    assert metrics.cancelled == {"disconnect": 1}
    assert metrics.cancel_delay_ticks.count == 1 and metrics.cancel_delay_ticks.sum <= 1


# ---- request building -------------------------------------------------------------------------------------
class StubPRMFormat:
    def encode(self, question, steps):
        return SimpleNamespace(token_ids=list(range(len(question) + 5)))


@pytest.fixture(scope="module")
def builder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    build_tokenizer(path)
    settings = ServerSettings(served_model_name="tiny", max_beam_size=16, request_timeout_s=30)
    return SearchBuilder(Tokenizer(path), "SYSTEM PROMPT", 512, StubPRMFormat(), 200, settings)


def chat(**fields) -> ChatCompletionRequest:
    body = {"messages": [{"role": "user", "content": "What is 2 + 2?"}]}
    body.update(fields)
    return ChatCompletionRequest.model_validate(body)


def test_builder_maps_fields_onto_the_search(builder):
    prepared = builder.chat(chat(temperature=0.5, top_p=0.9, seed=4, max_tokens=32, n=2,
                                 search={"preset": "ep+cd", "beam_size": 8, "beam_width": 2, "max_rounds": 5,
                                         "aggregation": "min", "timeout_s": 99}), "id1")
    config = prepared.request.config
    assert (config.temperature, config.top_p, config.seed, config.max_step_tokens) == (0.5, 0.9, 4, 32)
    assert (config.beam_size, config.beam_width, config.max_rounds, config.aggregation) == (8, 2, 5, "min")
    assert config.dedup and config.pruning == "strict"  # the preset's switches
    assert prepared.preset == "ep+cd" and prepared.n == 2 and prepared.timeout_s == 30  # capped by the server


def test_a_request_picks_its_lazy_verification_policy(builder):
    adaptive = builder.chat(chat(search={"preset": "specscale", "lv_policy": "adaptive"}), "id")
    assert adaptive.request.config.lv_policy == "adaptive"
    assert builder.chat(chat(search={"preset": "specscale-adaptive"}), "id").request.config.lv_policy == "adaptive"
    assert builder.chat(chat(search={"preset": "specscale"}), "id").request.config.lv_policy == "fixed"
    with pytest.raises(ValidationError):
        chat(search={"lv_policy": "sometimes"})


def test_a_request_preset_may_change_fields_in_brackets_and_a_bad_one_is_a_400_naming_it(builder):
    """search.preset takes `preset[field=value,...]` through the one parser the CLI uses (search/presets.py)."""
    config = builder.chat(chat(search={"preset": "specscale[lv_max_deferrals=3]", "beam_size": 8}), "id").request.config
    assert config.lv_max_deferrals == 3 and config.beam_size == 8 and config.verification == "lazy"
    for preset, fragment in (("greedy", "unknown preset"), ("specscale[speed=11]", "no field"),
                             ("specscale[lv_max_deferrals", "expected"), ("beam[beam_size=6]", "multiple")):
        with pytest.raises(APIError) as error:
            builder.chat(chat(search={"preset": preset}), "id")
        assert (error.value.status, error.value.param, error.value.code) == (400, "search.preset", "unknown_preset")
        assert fragment in error.value.message


def test_search_config_checks_the_values_and_the_server_only_its_own_limits(builder):
    """SearchConfig is the one owner of a value's validity: its error is a 400 naming the request's field; the
    server checks its beam-size cap and n within the beam."""
    cases = (({"search": {"beam_size": 6, "beam_width": 4}}, "search.beam_size", "multiple"),
             ({"search": {"beam_size": 0}}, "search.beam_size", ">= 1"),
             ({"search": {"max_rounds": 1001}}, "search.max_rounds", "[1, 1000]"),
             ({"search": {"beam_size": 32}}, "search.beam_size", "limit"),
             ({"n": 9, "search": {"beam_size": 8}}, "n", "beam_size"))
    for fields, param, fragment in cases:
        with pytest.raises(APIError) as error:
            builder.chat(chat(**fields), "id")
        assert error.value.status == 400 and error.value.param == param and fragment in error.value.message
    best_of_n = builder.chat(chat(search={"preset": "best-of-n"}), "id").request.config
    assert best_of_n.max_rounds == 1  # a field the request leaves unset keeps the preset's value


def test_builder_puts_the_system_prompt_first_and_asks_the_last_user_message(builder):
    prepared = builder.chat(chat(messages=[{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"},
                                           {"role": "user", "content": [{"type": "text", "text": "second?"}]}]), "id")
    text = builder.tokenizer.decode(prepared.request.prompt_ids, skip_special_tokens=False)
    assert text.index("SYSTEM PROMPT") < text.index("first") < text.index("second?")
    assert prepared.request.question == "second?"
    own = builder.chat(chat(messages=[{"role": "developer", "content": "MINE"}, {"role": "user", "content": "q"}]), "x")
    own_text = builder.tokenizer.decode(own.request.prompt_ids, skip_special_tokens=False)
    assert "MINE" in own_text and "SYSTEM PROMPT" not in own_text and "system" in own_text


def test_builder_rejects_a_question_too_long_for_the_prm(builder):
    with pytest.raises(APIError) as error:
        builder.chat(chat(messages=[{"role": "user", "content": "x" * 300}]), "id")
    assert error.value.status == 400 and "PRM" in error.value.message and error.value.param == "messages"


def test_field_path_reads_pydantic_locations():
    assert field_path(("messages", 0, "content", "str")) == "messages[0].content"
    assert field_path(("search", "beam_size")) == "search.beam_size"
    assert field_path(("prompt", "list[str]", 1)) == "prompt[1]"


# ---- responses and metrics ------------------------------------------------------------------------------
def path(answer: str, score: float) -> CompletedPath:
    return CompletedPath(f"\\boxed{{{answer}}}", (f"\\boxed{{{answer}}}",), (score,), score, answer, 3, 1)


def test_ranked_paths_put_the_voted_answer_first():
    paths = [path("1", 0.9), path("2", 0.8), path("2", 0.7), path("3", 0.1)]
    result = SearchResult("1", paths[0], paths, weighted_vote="2", majority_vote="2")
    assert [p.answer for p in ranked_paths(result, "best")] == ["1", "2", "2", "3"]
    assert [p.answer for p in ranked_paths(result, "weighted_vote")] == ["2", "2", "1", "3"]


def test_histogram_buckets_are_cumulative():
    histogram = Histogram((1, 2, 4))
    for value in (0.5, 1, 3, 9):
        histogram.observe(value)
    lines = histogram.lines("x", {"preset": "beam"})
    assert lines[:4] == ['x_bucket{preset="beam",le="1"} 2', 'x_bucket{preset="beam",le="2"} 2',
                         'x_bucket{preset="beam",le="4"} 3', 'x_bucket{preset="beam",le="+Inf"} 4']
    assert lines[-1] == 'x_count{preset="beam"} 4'


def test_token_rate_covers_the_last_window_and_decays_when_idle():
    rate = TokenRate(window_s=10)
    for second in range(21):
        rate.add(float(second), 100 * second)
    assert rate.per_second(20.0) == pytest.approx(100)
    assert rate.per_second(100.0) == 0.0  # nothing since second 20


# ---- checkpoints ------------------------------------------------------------------------------------------
def test_a_checkpoints_python_code_is_never_executed(tmp_path):
    """A folder asking for remote code (auto_map + a modeling file) loads with our own model code; the
    file is never imported."""
    from specscale.config import EngineConfig
    from specscale.engine.engine import Engine

    folder = build_stepping_generator(tmp_path / "gen")
    marker = tmp_path / "EXECUTED"
    (folder / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM",
                          "AutoConfig": "modeling_evil.EvilConfig"}
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copy(folder / "modeling_evil.py", folder / "tokenization_evil.py")
    Engine(EngineConfig(model=str(folder), kv_cache_memory_gb=0.01))
    assert not marker.exists()


def test_serve_without_a_checkpoint_says_which_one_is_missing(tmp_path, capsys):
    from specscale.cli import main

    assert main(["serve", "--generator", str(tmp_path / "nothing"), "--prm", str(tmp_path / "nothing")]) == 2
    assert "no checkpoint" in capsys.readouterr().out


def test_a_draining_engine_loop_refuses_new_searches_and_finishes_the_accepted_ones():
    async def main():
        loop = EngineLoop(scripted, ServerMetrics(), max_waiting=8, retry_after_s=3)
        accepted = [loop.submit(search_request(i), "beam", wants_progress=False) for i in range(3)]
        loop.drain()
        refused = loop.submit(search_request(9), "beam", wants_progress=False)
        assert not loop.idle()  # three accepted, none run yet
        loop.start()
        outcomes = [(await drain(h))[1] for h in accepted]
        while not loop.idle():
            await asyncio.sleep(0.001)
        loop.stop()
        return refused, outcomes, loop

    refused, outcomes, loop = asyncio.run(main())
    assert isinstance(refused, Refusal)
    assert (refused.status, refused.code, refused.retry_after_s) == (503, "draining", 3)
    assert all(o.result.error is None for o in outcomes)
    left = loop.left_at_stop
    assert left.cancelled == 0 and not left.work_left and left.snapshot.kv_blocks_used == 0


def test_request_outcomes_are_counted_by_route_outcome_status_and_reason():
    metrics = ServerMetrics()
    completed = RequestOutcome("/v1/completions", "completed", 200)
    for outcome in (completed, completed,
                    RequestOutcome.of_error("/v1/chat/completions", 499, "client_closed"),
                    RequestOutcome.of_error("/v1/chat/completions", 400, "invalid_json"),
                    RequestOutcome.of_error("/v1/chat/completions", 504, "timeout")):
        metrics.request_outcome(outcome)
    text = metrics.render(SimpleNamespace(running=0, waiting=0, kv_blocks_used=0, kv_blocks_total=0,
                                          prm_kv_blocks_used=0, live_sequences=0, failure=None, ticks=0))
    for line in ('specscale_requests_total{route="/v1/completions",outcome="completed",status="200",reason=""} 2',
                 'specscale_requests_total{route="/v1/chat/completions",outcome="cancelled",status="499",'
                 'reason="client_closed"} 1',
                 'specscale_requests_total{route="/v1/chat/completions",outcome="refused",status="400",'
                 'reason="invalid_json"} 1',
                 'specscale_requests_total{route="/v1/chat/completions",outcome="failed",status="504",'
                 'reason="timeout"} 1'):
        assert line in text, line
