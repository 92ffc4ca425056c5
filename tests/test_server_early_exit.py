"""The early-exit flag in the server's responses (docs/design.md "Early exit"; README "Serving"): the `search`
object says which rule ended a search early (`search.early_exit`: null, "settled", "certain" or "stalled"),
whole and streamed, read with the official `openai` client from the real app in front of the scripted backend
(tests/live_app.py). The negative exit is the one a client must see: its answer may be a running path's."""

from __future__ import annotations

import openai
import pytest

from live_app import API_KEY, MODEL, live_builder, serve
from specscale.server.settings import ServerSettings

SETTINGS = ServerSettings(served_model_name=MODEL, api_key=API_KEY, max_beam_size=8, request_timeout_s=10)
MESSAGES = [{"role": "user", "content": "Tom has 12 apples. He buys 7 more. How many apples does Tom have?"}]
SEARCH = {"beam_size": 4, "beam_width": 2, "max_rounds": 6}
# a floor no running path reaches (the scripted PRM scores below 1.0): the search stalls after one flat round
STALLING = "beam[early_exit=stall,exit_floor=1.0,exit_stall_rounds=1]"
# a floor of zero: a search never stalls (docs/design.md "Early exit")
NEVER = "beam[early_exit=stall,exit_floor=0.0,exit_stall_rounds=1]"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    builder = live_builder(tmp_path_factory.mktemp("tok"), SETTINGS)
    with serve(builder, SETTINGS) as app:
        yield openai.OpenAI(base_url=f"{app.url}/v1", api_key=API_KEY, max_retries=0, timeout=30)


def summary(obj) -> dict:
    return (obj.model_extra or {})["search"]


def complete(client, preset: str, seed: int, **fields):
    return client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, seed=seed, n=4,
                                          extra_body={"search": dict(SEARCH, preset=preset)}, **fields)


def stalled_seeds(client, seeds=range(8)) -> list[int]:
    return [s for s in seeds if summary(complete(client, STALLING, s))["early_exit"] == "stalled"]


def test_a_search_that_runs_to_its_end_says_null(client):
    for preset in ("beam", NEVER):
        response = complete(client, preset, seed=1)
        assert "early_exit" in summary(response) and summary(response)["early_exit"] is None
        assert response.choices


def test_a_stalled_search_says_so_and_still_answers(client):
    seeds = stalled_seeds(client)
    assert seeds, "the stall never fired: the test has no power"
    for seed in seeds:
        stalled, plain = complete(client, STALLING, seed), complete(client, "beam", seed)
        assert summary(stalled)["rounds"] < summary(plain)["rounds"]
        assert summary(plain)["early_exit"] is None
        assert stalled.choices and all(c.message.content for c in stalled.choices)
        scores = [(c.model_extra or {})["score"] for c in stalled.choices]
        assert scores == sorted(scores, reverse=True)


def test_the_stream_carries_the_flag_on_its_last_finish_chunk(client):
    seed = stalled_seeds(client)[0]
    chunks = list(complete(client, STALLING, seed, stream=True, stream_options={"include_usage": True}))
    flagged = [c for c in chunks if "search" in (c.model_extra or {})]
    assert len(flagged) == 1 and summary(flagged[0])["early_exit"] == "stalled"
    assert flagged[0].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage is not None  # the usage chunk still follows
    streamed = list(complete(client, "beam", seed, stream=True))
    assert [summary(c)["early_exit"] for c in streamed if "search" in (c.model_extra or {})] == [None]
