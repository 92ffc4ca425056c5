"""Property-based fuzzing of the HTTP surface (issue 16), over real uvicorn on loopback in front of the
scripted backend (tests/live_app.py): request bodies drawn from the request schema (every field, right and
wrong types, unknown keys, strings with special-token text and lone surrogates) and raw bodies (any bytes,
broken JSON, deep nesting). For every one: never a 5xx, an error is OpenAI's error JSON, the connection is
never dropped without `Connection: close`, and the next request on the same connection is answered.
Runs in well under a minute."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from live_app import MODEL, live_builder, serve
from specscale.server.protocol import ChatCompletionRequest, CompletionRequest, SearchOptions
from specscale.server.settings import ServerSettings

SETTINGS = ServerSettings(served_model_name=MODEL, api_key="live-key", max_beam_size=8, request_timeout_s=20,
                          max_body_bytes=16 * 1024)
PATHS = ("/v1/chat/completions", "/v1/completions")
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# strings a tokenizer or a template might trip on: special-token text, lone surrogates, control characters
texts = st.one_of(st.text(max_size=20), st.sampled_from([
    "What is 2 + 3?", "<|im_end|>\n<|im_start|>assistant\n", "<extra_0>", "\ud800", "a\udfffb", "\x00", "{{ 7 * 7 }}",
    "{% for x in y %}", "  ", "", "\n\n", "\\boxed{4}"]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 10), st.floats(-1, 3, allow_nan=False),
                    st.sampled_from([2**63, -(2**70), 1e308]), texts)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                             st.dictionaries(texts, inner, max_size=3)), max_leaves=8)
turns = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant"]),
                                        "content": texts}), max_size=2)
questions = st.fixed_dictionaries({"role": st.just("user"), "content": st.one_of(texts, st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": texts}), min_size=1, max_size=2))})
VALID_SEARCH = {"beam_size": 2, "beam_width": 2, "max_rounds": 2}
valid_bodies = {  # most often a request that reaches tokenization and the search
    PATHS[0]: st.fixed_dictionaries({"model": st.just(MODEL), "messages": st.tuples(turns, questions).map(
        lambda chat: [*chat[0], chat[1]]), "search": st.just(VALID_SEARCH)}),
    PATHS[1]: st.fixed_dictionaries({"model": st.just(MODEL), "prompt": st.one_of(texts, st.lists(texts, max_size=2)),
                                     "search": st.just(VALID_SEARCH)}),
}
messages = st.one_of(json_values, st.lists(st.one_of(json_values, st.fixed_dictionaries(
    {"role": st.one_of(texts, st.just("tool")), "content": json_values})), max_size=2))
search = st.one_of(json_values, st.dictionaries(st.sampled_from([*SearchOptions.model_fields, "beam_sise"]),
                                                json_values, max_size=4))


def bodies(path: str) -> st.SearchStrategy[dict]:
    """A valid body with up to three fields replaced by anything (any JSON value, a wrong shape of the main
    fields) and maybe one removed."""
    model = ChatCompletionRequest if path == PATHS[0] else CompletionRequest
    keys = st.sampled_from([*model.model_fields, "unknown_field"])
    special = {"messages": messages, "prompt": json_values, "search": search}
    changes = st.lists(keys, max_size=3, unique=True).flatmap(
        lambda names: st.fixed_dictionaries({name: special.get(name, json_values) for name in names}))
    return st.tuples(valid_bodies[path], changes, st.lists(keys, max_size=1)).map(
        lambda parts: {k: v for k, v in {**parts[0], **parts[1]}.items() if k not in parts[2]})


raw_bodies = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(lambda text: text.encode("utf-8", "surrogatepass")),
    st.integers(1, 3000).map(lambda depth: b'{"messages": ' + b"[" * depth + b"]" * depth + b"}"),
    st.tuples(st.integers(0, 60), st.binary(min_size=1, max_size=5)).map(
        lambda cut: json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "2 + 2?"}],
                                "search": {"beam_size": 2, "beam_width": 2}}).encode()[:cut[0]] + cut[1]),
)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with serve(live_builder(tmp_path_factory.mktemp("tok"), SETTINGS), SETTINGS) as app:
        yield app


@pytest.fixture(scope="module")
def connection(live):
    holder = {"connection": live.connect()}
    yield holder
    holder["connection"].close()


def check(live, connection: dict, path: str, body: bytes) -> None:
    """One request on the kept-alive connection, then /health on the same connection."""
    if not connection["connection"].reusable:  # an earlier example failed half-way: start clean
        connection["connection"].close()
        connection["connection"] = live.connect()
    reply = connection["connection"].post_json(path, body)
    assert reply.status < 500, (reply.status, reply.body[:300])
    if reply.status != 200:
        error = json.loads(reply.body)["error"]
        assert set(error) == {"message", "type", "param", "code"}
    if reply.headers.get("connection") == "close":  # the server said so: a new connection is fine
        connection["connection"].close()
        connection["connection"] = live.connect()
    assert connection["connection"].request("GET", "/health").status == 200


@FUZZ
@given(path=st.sampled_from(PATHS), data=st.data())
def test_schema_shaped_bodies_never_get_a_5xx_or_lose_the_connection(live, connection, path, data):
    body = data.draw(bodies(path))
    check(live, connection, path, json.dumps(body).encode())


@FUZZ
@given(path=st.sampled_from(PATHS), body=raw_bodies)
def test_raw_bodies_never_get_a_5xx_or_lose_the_connection(live, connection, path, body):
    check(live, connection, path, body)
