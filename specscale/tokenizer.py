"""Tokenizer of a local Hugging Face folder: `tokenizer.json` through the `tokenizers` library, the chat
template of `tokenizer_config.json` rendered with a sandboxed jinja2 (as transformers does), and the
bytes of every token for stop-string detection across token boundaries.

`encode` reads added tokens (`<|im_end|>`...) wherever their text appears; `encode_text` spells them out
as ordinary text, for text nobody vouches for (message contents, generated steps: see chat_text.py)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of the GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to 256+."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}


def _token_content(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


class ChatTokenizer(Protocol):
    """What a stack's readers use of its generator's tokenizer (`stack.py` `Stack.tokenizer`, `chat_text.py`):
    this module's `Tokenizer` and the simulator's `sim/tokenizer.py` `SyntheticTokenizer`."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def encode_text(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = False) -> str: ...


class Tokenizer:
    """Encode / decode, special ids, chat templates and per-token bytes of one checkpoint folder."""

    def __init__(self, path: str | Path):
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"no tokenizer.json in {path}")
        self._tok = HFTokenizer.from_file(str(path / "tokenizer.json"))
        config = _read_json(path / "tokenizer_config.json")
        self.chat_template = config.get("chat_template") or _read_text(path / "chat_template.jinja")
        self.eos_token = _token_content(config.get("eos_token"))
        self.bos_token = _token_content(config.get("bos_token"))
        added = self._tok.get_added_tokens_decoder()  # id -> AddedToken
        self.special_ids = {token_id for token_id, token in added.items() if token.special}
        self.added_token_pattern = added_token_pattern(token.content for token in added.values())
        self._text_tok = _plain_text_tokenizer(self._tok)
        self.eos_token_ids = self._eos_ids(path)
        self.token_bytes = self._build_token_bytes()

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_text(self, text: str) -> list[int]:
        """Token ids of `text` with every added token's text tokenized as ordinary text."""
        return self._text_tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = False,
                            tools: list[dict] | None = None) -> str:
        """The chat as text; `tools` are JSON schemas of functions (OpenAI's `tools` entries), which the
        template renders as transformers renders them (e.g. Qwen2.5's <tools> block)."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat_template")
        return render_chat(self.chat_template, messages, add_generation_prompt, self.bos_token, self.eos_token, tools)

    def _eos_ids(self, path: Path) -> set[int]:
        ids = set()
        eos = self.token_to_id(self.eos_token) if self.eos_token else None
        if eos is not None:
            ids.add(eos)
        generation = _read_json(path / "generation_config.json").get("eos_token_id")
        model = _read_json(path / "config.json").get("eos_token_id")
        for value in (generation, model):
            ids.update([value] if isinstance(value, int) else value or [])
        return ids

    def _build_token_bytes(self) -> list[bytes]:
        """bytes of each token id as it appears in decoded text (special tokens: empty)."""
        size = self.vocab_size
        decoder = json.loads(self._tok.to_str()).get("decoder") or {}
        byte_level = "ByteLevel" in json.dumps(decoder)
        table = _unicode_to_byte()
        out: list[bytes] = []
        for token_id in range(size):
            piece = self._tok.id_to_token(token_id)
            if piece is None or token_id in self.special_ids:
                out.append(b"")
            elif byte_level and all(ch in table for ch in piece):
                out.append(bytes(table[ch] for ch in piece))
            else:
                out.append(self._tok.decode([token_id], skip_special_tokens=True).encode("utf-8"))
        return out


def added_token_pattern(contents) -> re.Pattern:
    """A regex whose one group matches any of these added tokens, the longest first where several start at
    one place (as the tokenizers library matches them); it never matches when there are none."""
    alternatives = [re.escape(text) for text in sorted(set(contents), key=len, reverse=True) if text]
    return re.compile("(" + ("|".join(alternatives) or "(?!x)x") + ")")


def _plain_text_tokenizer(tokenizer: HFTokenizer) -> HFTokenizer:
    """A copy that reads no added token: all are marked special and special tokens are encoded as text."""
    spec = json.loads(tokenizer.to_str())
    for token in spec.get("added_tokens") or []:
        token["special"] = True
    plain = HFTokenizer.from_str(json.dumps(spec))
    plain.encode_special_tokens = True
    return plain


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _read_text(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def render_chat(template: str, messages: list[dict], add_generation_prompt: bool, bos_token: str | None,
                eos_token: str | None, tools: list[dict] | None = None) -> str:
    """A jinja2 chat template rendered as transformers renders it (sandboxed, trimmed blocks; `tools` and
    `documents` defined, None when not given)."""
    for tool in tools or []:
        if not isinstance(tool, dict):
            raise ValueError(f"tools must be JSON schemas (dicts), got {type(tool).__name__}")
    return _compile_template(template).render(messages=messages, tools=tools, documents=None,
                                              add_generation_prompt=add_generation_prompt,
                                              bos_token=bos_token or "", eos_token=eos_token or "")


@lru_cache(maxsize=16)
def _compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_template_error
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """jinja2's tojson without its HTML escaping, with json.dumps' options (as transformers' templates expect)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_template_error(message: str):
    raise jinja2.exceptions.TemplateError(message)
