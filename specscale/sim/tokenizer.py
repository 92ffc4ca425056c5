"""SyntheticTokenizer: the simulated models' word-level vocabulary, with the real tokenizer's interface.

The simulated generator samples from the first `generated_size` ids only (its head columns):

    eos, the step delimiter "\\n\\n", the answers " \\boxed{v}", the final-step openers " Therefore" (sound)
    and " Hence" (a slip), the step openers " o0".. (sound) and " x0".. (slips), the words " w0"..

A slip opener marks a step that erred (the workload's latent error process); the simulated PRM reads it
back from its own input. After them come ids no model samples: the chat templates' special tokens
(`<|im_start|>`, `<extra_0>`, `<|start_header_id|>`...), template words, the prompts' question and
level words, every word again without its leading space (the Llama PRM format strips steps), and 256 byte
tokens that spell any other text. Encoding splits at special tokens, then into "\\n\\n", "\\n", words with
their leading space and single whitespace characters; a piece outside the vocabulary becomes its UTF-8
bytes. So decoding generated ids and encoding the text again gives the same ids, and a PRM input cut
right after a special token tokenizes piece by piece exactly as a whole (what `PRMFormat` checks).
"""

from __future__ import annotations

import re

from specscale.prompts import PRM_SYSTEM_PROMPT, STEP_SEPARATOR
from specscale.tokenizer import added_token_pattern, render_chat

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_SYSTEM = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
LLAMA3_TEMPLATE = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" + LLAMA3_SYSTEM + "<|eot_id|>"
    "{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
TEMPLATES = {"chatml": CHATML_TEMPLATE, "llama3": LLAMA3_TEMPLATE}
EOS_TEXT = "<|im_end|>"
SPECIAL_TEXTS = (EOS_TEXT, "<|im_start|>", "<extra_0>", "<|begin_of_text|>", "<|start_header_id|>",
                 "<|end_header_id|>", "<|eot_id|>")
PIECES = re.compile(r"\n\n|\n| ?[^\s]+|\s")
# every word of the templates and of the Qwen PRM's system prompt is one token, as in the real vocabularies
TEMPLATE_WORDS = ("\n", " ", "system", "user", "assistant", "+", "-",
                  *PIECES.findall(LLAMA3_SYSTEM.replace("\n\n", "") + " " + PRM_SYSTEM_PROMPT))


class SyntheticTokenizer:
    """See the module docstring. template: "chatml" (Qwen) or "llama3" (the RLHFlow PRM's)."""

    def __init__(self, template: str = "chatml", answers: int = 16, openers: int = 8, words: int = 64,
                 question_words: int = 256, levels: int = 5, system_words: int = 64):
        if template not in TEMPLATES:
            raise ValueError(f"template must be one of {sorted(TEMPLATES)}, got {template!r}")
        self.chat_template = TEMPLATES[template]
        self.bos_token, self.eos_token = None, EOS_TEXT
        self._texts: list[str] = []
        self.eos = self._add(EOS_TEXT)
        self.delimiter = self._add(STEP_SEPARATOR)
        self.answer_values = tuple(str(v) for v in range(answers))
        self.answer_ids = self._add_all(f" \\boxed{{{v}}}" for v in self.answer_values)
        self.final_good, self.final_slip = self._add(" Therefore"), self._add(" Hence")
        self.good_openers = self._add_all(f" o{k}" for k in range(openers))
        self.slip_openers = self._add_all(f" x{k}" for k in range(openers))
        self.words = self._add_all(f" w{k}" for k in range(words))
        self.generated_size = len(self._texts)
        self.special_ids = frozenset(self._add(t) for t in SPECIAL_TEXTS[1:]) | {self.eos}
        self._add_all(dict.fromkeys(word for word in TEMPLATE_WORDS if word not in self._texts))
        self.level_ids = self._add_all(f" L{k}" for k in range(1, levels + 1))
        self.question_ids = self._add_all(f" q{k}" for k in range(question_words))
        self.system_ids = self._add_all(f" s{k}" for k in range(system_words))
        spaced = [t for t in self._texts if len(t) > 1 and t[0] == " "]
        self._add_all(dict.fromkeys(t[1:] for t in spaced if t[1:] not in self._texts))
        self._byte_base = len(self._texts)
        self._ids = {text: i for i, text in enumerate(self._texts)}
        self._specials = {self._texts[i]: i for i in self.special_ids}
        self.added_token_pattern = added_token_pattern(SPECIAL_TEXTS)
        self.token_bytes = [b"" if i in self.special_ids else t.encode() for i, t in enumerate(self._texts)]
        self.token_bytes += [bytes([b]) for b in range(256)]
        self.eos_token_ids = {self.eos}
        slips = [self.final_slip, *self.slip_openers]
        self.slip_ids = frozenset(slips + [self._ids[self._texts[i][1:]] for i in slips])
        self.assistant = self._ids["assistant"]

    def _add(self, text: str) -> int:
        self._texts.append(text)
        return len(self._texts) - 1

    def _add_all(self, texts) -> list[int]:
        return [self._add(text) for text in texts]

    @property
    def vocab_size(self) -> int:
        return self._byte_base + 256

    def token_to_id(self, token: str) -> int | None:
        return self._ids.get(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        for part in self.added_token_pattern.split(text):
            special = self._specials.get(part)
            ids += [special] if special is not None else self.encode_text(part)
        return ids

    def encode_text(self, text: str) -> list[int]:
        """Token ids with special-token text spelled out as ordinary text (bytes outside the vocabulary)."""
        ids: list[int] = []
        for piece in PIECES.findall(text):
            token = self._ids.get(piece)
            if token is not None and token not in self.special_ids:
                ids.append(token)
            else:
                ids += [self._byte_base + b for b in piece.encode()]
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        parts = [self._texts[i].encode() if i < self._byte_base and not (i in self.special_ids and skip_special_tokens)
                 else self.token_bytes[i] for i in ids]
        return b"".join(parts).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return render_chat(self.chat_template, messages, add_generation_prompt, self.bos_token, self.eos_token)

    def text(self, token_id: int) -> str:
        """The text of one vocabulary token (special tokens included)."""
        return self._texts[token_id]
