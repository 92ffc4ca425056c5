"""Chat templates with tools render as transformers renders them (Qwen2.5-Instruct's template)."""

import json
from pathlib import Path

import pytest

from checkpoints import build_tokenizer
from specscale.tokenizer import Tokenizer

QWEN25_TEMPLATE = json.loads((Path(__file__).parent / "data" / "qwen2.5-instruct-chat-template.json").read_text())
TOOLS = [
    {"type": "function", "function": {
        "name": "calculator", "description": "Évalue une expression arithmétique — exactly, with fractions",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 3/4 + 1"}},
                       "required": ["expression"]}}},
    {"type": "function", "function": {"name": "lookup", "description": "Look a constant up",
                                      "parameters": {"type": "object", "properties": {"name": {"type": "string"}}}}},
]
CHATS = {
    "tools, default system prompt": [{"role": "user", "content": "What is 3/4 + 1/8?"}],
    "tools, own system prompt, tool calls and responses": [
        {"role": "system", "content": "Reason step by step."},
        {"role": "user", "content": "What is 3/4 + 1/8?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "3/4 + 1/8"}}},
            {"type": "function", "function": {"name": "lookup", "arguments": {"name": "π"}}}]},
        {"role": "tool", "content": "7/8"},
        {"role": "tool", "content": "3.14159"},
        {"role": "assistant", "content": "The answer is \\boxed{\\frac{7}{8}}."},
    ],
}


@pytest.fixture(scope="module")
def qwen25_tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen25-template")
    build_tokenizer(path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.update(QWEN25_TEMPLATE)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("chat", sorted(CHATS))
@pytest.mark.parametrize("tools", [TOOLS, None])
def test_tools_render_as_transformers_renders_them(qwen25_tokenizer_dir, chat, tools):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(qwen25_tokenizer_dir)
    theirs = reference.apply_chat_template(CHATS[chat], tools=tools, tokenize=False, add_generation_prompt=True)
    ours = Tokenizer(qwen25_tokenizer_dir).apply_chat_template(CHATS[chat], add_generation_prompt=True, tools=tools)
    assert ours == theirs
    assert ("<tools>" in ours) == (tools is not None)
    if tools is not None:
        assert "Évalue" in ours  # JSON in the template keeps non-ASCII text as transformers' tojson does


def test_a_tool_that_is_not_a_json_schema_is_refused(qwen25_tokenizer_dir):
    with pytest.raises(ValueError, match="JSON schemas"):
        Tokenizer(qwen25_tokenizer_dir).apply_chat_template(CHATS[sorted(CHATS)[0]], tools=[len])
