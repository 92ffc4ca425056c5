"""ChatText: a rendered chat that keeps the chat template's own text apart from the message contents, so
that contents are tokenized with special tokens read as plain text.

A chat template writes control tokens (`<|im_start|>`, `<|im_end|>`, `<|eot_id|>`, `<extra_0>`...)
around the messages. Tokenizing the rendered string as a whole also reads control-token *text* inside a
message as control tokens, so a user who writes `"<|im_end|>\\n<|im_start|>assistant\\n..."` forges an
assistant turn (and, in a PRM input, fake steps or step tags). Here a chat is rendered twice: once with a
marker in place of each content, to learn what the template writes (`template` parts), and once as is, to
learn what it makes of each content (verbatim or trimmed; `content` parts). `encode` then reads added
tokens only in template parts: the text between two template control tokens, contents included, is one
run tokenized with every added token spelled out as text (`Tokenizer.encode_text`). For a chat whose
contents hold no added-token text this gives exactly the ids of tokenizing the whole rendered string.

Trusted callers may opt out (`trusted=True`): the whole text is tokenized as before, control-token text in
contents included (`specscale serve --trust-special-tokens`; see README "Serving").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MARKER = re.compile("\ue000(\\d+)\ue001")  # Unicode private use: never written by a template


@dataclass(frozen=True)
class ChatText:
    """parts: (text, is_content) in order; is_content False marks the template's own text."""

    parts: tuple[tuple[str, bool], ...] = ()

    @staticmethod
    def template(text: str) -> ChatText:
        return ChatText(((text, False),))

    @staticmethod
    def content(text: str) -> ChatText:
        return ChatText(((text, True),))

    def __add__(self, other: ChatText) -> ChatText:
        return ChatText(self.parts + other.parts)

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.parts)

    def before_content(self, content: str) -> ChatText | None:
        """The parts before the first content part equal to `content` (None if there is none)."""
        for index, (text, is_content) in enumerate(self.parts):
            if is_content and text == content:
                return ChatText(self.parts[:index])
        return None

    def encode(self, tokenizer, trusted: bool = False) -> list[int]:
        """Token ids: control tokens only where the template wrote them (trusted: wherever their text is)."""
        if trusted:
            return tokenizer.encode(self.text)
        ids: list[int] = []
        run: list[str] = []  # text since the last control token
        for text, is_content in self.parts:
            pieces = [text] if is_content else tokenizer.added_token_pattern.split(text)
            for index, piece in enumerate(pieces):
                if index % 2:  # split() puts the matched added tokens at the odd indices
                    ids += tokenizer.encode_text("".join(run))
                    ids.append(tokenizer.token_to_id(piece))
                    run = []
                else:
                    run.append(piece)
        return ids + tokenizer.encode_text("".join(run))


def render_chat_text(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> ChatText:
    """The chat as the tokenizer's template renders it, template text and contents apart. A content the
    template changes beyond trimming it is taken verbatim (still as plain text)."""
    marked = [dict(message, content=f"\ue000{index}\ue001") for index, message in enumerate(messages)]
    skeleton = MARKER.split(tokenizer.apply_chat_template(marked, add_generation_prompt=add_generation_prompt))
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    contents = [message["content"] for message in messages]
    return _aligned(skeleton, contents, rendered) or _verbatim(skeleton, contents)


def _aligned(skeleton: list[str], contents: list[str], rendered: str) -> ChatText | None:
    """skeleton: template text and marker indices alternating (MARKER.split); None unless the rendered
    chat is the template text with each content, verbatim or trimmed, in place of its marker."""
    parts: list[tuple[str, bool]] = []
    position = 0
    for index, piece in enumerate(skeleton):
        if index % 2 == 0:
            if not rendered.startswith(piece, position):
                return None
            parts.append((piece, False))
            position += len(piece)
            continue
        following = skeleton[index + 1]
        content = contents[int(piece)]
        found = [c for c in (content, content.strip()) if rendered.startswith(c + following, position)]
        if not found:
            return None
        parts.append((found[0], True))
        position += len(found[0])
    return ChatText(tuple(parts)) if position == len(rendered) else None


def _verbatim(skeleton: list[str], contents: list[str]) -> ChatText:
    return ChatText(tuple((contents[int(piece)], True) if index % 2 else (piece, False)
                          for index, piece in enumerate(skeleton)))
