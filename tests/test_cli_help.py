"""`specscale serve -h` says each option's default once (issue 45): not after a help text that already states
it, and never "(default: None)" or "(default: False)"."""

from __future__ import annotations

import re

from specscale.cli import build_parser


def serve_help() -> str:
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    return " ".join(serve.format_help().split())


def test_serve_help_gives_each_default_once():
    text = serve_help()
    assert "(default: None)" not in text and "(default: False)" not in text
    assert not re.search(r"default[^()]*\) \(default:", text), text
    assert "the API's model id (default: generator folder name) --" in text
    assert "searches running at once (default: 32)" in text
    assert "GPUs each replica reserves (default: 0.0)" in text
