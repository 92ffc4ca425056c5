"""PRM input formats: (question, steps) -> PRM token ids and score positions; head outputs -> step scores.

Two formats (docs/design.md, "PRM formats"):

- ``qwen-math-prm`` (Qwen/Qwen2.5-Math-PRM-7B): system prompt, user question, one assistant message
  holding the steps each followed by ``<extra_0>``; score = softmax(score-head logits)[1] at each
  ``<extra_0>``.
- ``rlhflow`` (RLHFlow/Llama3.1-8B-PRM-Deepseek-Data): one user turn per step (the first is
  question + " " + step) each answered by an assistant "+"; score = softmax over the LM logits of the
  "+" and "-" tokens, read at the position that predicts the assistant "+".

Both render the PRM's own chat template. Prefix reuse rests on one property: the token ids for steps
1..j are a token-exact prefix of the token ids for steps 1..k (j < k). A format therefore cuts the
rendered chat into one *piece* per step, each ending right after a special token (the step's
``<extra_0>``; the ``<|eot_id|>`` closing the assistant's "+"). The tokenizer splits text at special
tokens before running BPE, so encoding the pieces one by one and concatenating equals encoding the whole
rendered chat; `PRMFormat.check_template` verifies this on a probe chat when a format is built.

Pieces are `ChatText`s (chat_text.py): the question and the steps are contents, tokenized with any
special-token text in them read as plain text, so neither a question nor a generated step can forge a
turn or a step tag; only the template and the format write control tokens. `trust_special_tokens`
reads such text as control tokens again (trusted callers only).

Steps are cleaned first (`clean_steps`): each given step is split on the "\\n\\n" step delimiter (a
final-round or best-of-N text holds several steps, scored one by one as search-and-learn does), trailing
newlines are removed and empty pieces dropped, so a search that passes steps ending in "\\n\\n" never
scores an extra empty step. Scores are computed in the dtype of the head outputs, as the reference code does (a bf16 PRM
that is sure gives exactly 1.0).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from specscale.chat_text import ChatText, render_chat_text
from specscale.prompts import PRM_STEP_TAG, PRM_SYSTEM_PROMPT, STEP_SEPARATOR
from specscale.tokenizer import Tokenizer

# Stands in for text while a template is rendered, to find where that text lands (Unicode private use).
PLACEHOLDER = "\ue000placeholder\ue001"
# distinct piece texts whose token ids are remembered per format: the pieces of the paths in flight (a search
# re-encodes its paths' earlier steps every round). Each entry holds ~1.8 KB on the toy PRM (the piece, its ids);
# at 1 << 16 a soak's server filled it for ~25 minutes, ~4 MiB a minute of its RSS creep (docs/bench/serve-soak.md)
PIECE_MEMO_SIZE = 1 << 12
# whole inputs remembered per format: a path is encoded when its step is queued (the LV trigger counts its
# tokens) and again when it is scored
INPUT_MEMO_SIZE = 1 << 12


def clean_steps(steps: Sequence[str]) -> list[str]:
    """Steps as they are scored: every given step split on "\\n\\n", trailing newlines removed, empty (or
    blank) pieces dropped."""
    cleaned = (piece.rstrip("\n") for step in steps for piece in step.split(STEP_SEPARATOR))
    return [piece for piece in cleaned if piece.strip()]


@dataclass(frozen=True)
class PRMInput:
    """A path's PRM input: token_ids[:step_ends[j]] is the whole input for steps 0..j (a token-exact
    prefix of the input for any longer path), and the head output at score_positions[j] scores step j."""

    token_ids: tuple[int, ...]
    score_positions: tuple[int, ...]
    step_ends: tuple[int, ...]

    @property
    def num_steps(self) -> int:
        return len(self.step_ends)

    def first_steps(self, num_steps: int) -> PRMInput:
        """The input for the first num_steps steps only (num_steps >= 1)."""
        end = self.step_ends[num_steps - 1]
        return PRMInput(self.token_ids[:end], self.score_positions[:num_steps], self.step_ends[:num_steps])


class PRMFormat(ABC):
    """How one PRM family reads a solution: the seam between the verifier and a model family.

    The verifier (engine, batching, prefix cache) only needs `encode` (token ids, the position whose head
    output scores each step, and where each step's prefix ends) and `scores` (head outputs -> scores in
    [0, 1]). A format supplies the chat of its reference recipe (`messages`), the same chat cut into one
    text piece per step (`step_pieces`), the index inside a step's piece whose head output scores it
    (`score_index`) and the score formula (`scores`).
    """

    name: ClassVar[str]
    uses_lm_head: ClassVar[bool]  # True: head outputs are vocabulary logits; False: a 2-class score head

    def __init__(self, tokenizer: Tokenizer, trust_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.trust_special_tokens = trust_special_tokens
        self._piece_ids = functools.lru_cache(maxsize=PIECE_MEMO_SIZE)(self._encode_piece)
        self._inputs = functools.lru_cache(maxsize=INPUT_MEMO_SIZE)(self._encode_input)
        self.check_template()

    # ---- what a format defines -----------------------------------------------------------------
    @abstractmethod
    def messages(self, question: str, steps: Sequence[str]) -> list[dict[str, str]]:
        """The chat of the format's reference recipe for these (clean, non-empty) steps."""

    @abstractmethod
    def step_pieces(self, question: str, steps: Sequence[str]) -> list[ChatText]:
        """The rendered chat cut after each step: piece j ends right after a special token, and the
        concatenation of pieces 0..j is a prefix of `render` (question, steps[:k]) for every k > j."""

    @abstractmethod
    def score_index(self, piece_ids: Sequence[int]) -> int:
        """Index, inside one step's piece, of the token whose head output scores that step."""

    @abstractmethod
    def scores(self, readouts: torch.Tensor) -> list[float]:
        """Head outputs at the score positions ([steps, head_out]) -> one score in [0, 1] per step."""

    # ---- shared ------------------------------------------------------------------------------
    def render(self, question: str, steps: Sequence[str]) -> str:
        """The whole chat rendered by the PRM's own template (no generation prompt)."""
        return self.tokenizer.apply_chat_template(self.messages(question, steps), add_generation_prompt=False)

    def render_text(self, question: str, steps: Sequence[str]) -> ChatText:
        """`render` with the template's text and the contents (question, steps) apart."""
        return render_chat_text(self.tokenizer, self.messages(question, steps), add_generation_prompt=False)

    def encode(self, question: str, steps: Sequence[str]) -> PRMInput:
        """Token ids of the chat up to the last step's boundary, its score positions and step ends."""
        if not steps:
            raise ValueError("a PRM input needs at least one step")
        return self._inputs(question, tuple(steps))

    def _encode_input(self, question: str, steps: tuple[str, ...]) -> PRMInput:
        token_ids: list[int] = []
        score_positions, step_ends = [], []
        for piece in self.step_pieces(question, steps):
            piece_ids = self._piece_ids(piece)
            score_positions.append(len(token_ids) + self.score_index(piece_ids))
            token_ids += piece_ids
            step_ends.append(len(token_ids))
        return PRMInput(tuple(token_ids), tuple(score_positions), tuple(step_ends))

    def _encode_piece(self, piece: ChatText) -> tuple[int, ...]:
        return tuple(piece.encode(self.tokenizer, trusted=self.trust_special_tokens))

    def check_template(self) -> None:
        """Raise ValueError unless the pieces of a probe chat tokenize exactly like the rendered chat."""
        question, steps = "What is 2 + 3?", ["We add: 2 + 3 = 5.", "Check it\nagain.", "So \\boxed{5}."]
        pieces = self.step_pieces(question, steps)
        whole = self.render(question, steps)
        if not whole.startswith("".join(piece.text for piece in pieces)):
            raise ValueError(f"{self.name}: the chat template does not render the step pieces as a prefix")
        encoded = self.encode(question, steps)
        if list(encoded.token_ids) != self.tokenizer.encode(whole)[: len(encoded.token_ids)]:
            raise ValueError(f"{self.name}: step pieces do not tokenize like the whole chat (a piece must "
                             "end right after a special token)")


class QwenMathPRMFormat(PRMFormat):
    """Qwen2.5-Math-PRM: steps joined by <extra_0> in one assistant message; P(class 1) at each tag."""

    name = "qwen-math-prm"
    uses_lm_head = False

    def __init__(self, tokenizer: Tokenizer, system_prompt: str = PRM_SYSTEM_PROMPT,
                 trust_special_tokens: bool = False):
        self.system_prompt = system_prompt
        tag_ids = tokenizer.encode(PRM_STEP_TAG)
        if len(tag_ids) != 1:
            raise ValueError(f"{self.name}: the tokenizer must hold {PRM_STEP_TAG} as one (added) token")
        self.step_tag_id = tag_ids[0]
        self._chat_head = functools.lru_cache(maxsize=1024)(self._render_chat_head)
        super().__init__(tokenizer, trust_special_tokens)

    def messages(self, question: str, steps: Sequence[str]) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": question},
            {"role": "assistant", "content": "".join(step + PRM_STEP_TAG for step in steps)},
        ]

    def step_pieces(self, question: str, steps: Sequence[str]) -> list[ChatText]:
        head = self._chat_head(question)  # everything before the assistant's content
        tag = ChatText.template(PRM_STEP_TAG)
        return [head + ChatText.content(steps[0]) + tag] + [ChatText.content(step) + tag for step in steps[1:]]

    def _render_chat_head(self, question: str) -> ChatText:
        messages = self.messages(question, [])
        messages[-1]["content"] = PLACEHOLDER
        head = render_chat_text(self.tokenizer, messages).before_content(PLACEHOLDER)
        if head is None:
            raise ValueError(f"{self.name}: the chat template does not render the assistant content verbatim")
        return head

    def score_index(self, piece_ids: Sequence[int]) -> int:
        if piece_ids[-1] != self.step_tag_id:
            raise ValueError(f"{self.name}: a step piece must end with {PRM_STEP_TAG}")
        return len(piece_ids) - 1

    def scores(self, readouts: torch.Tensor) -> list[float]:
        probs = torch.softmax(readouts, dim=-1)  # [steps, 2]
        return probs[:, 1].float().tolist()


class RLHFlowFormat(PRMFormat):
    """RLHFlow Llama PRM: a user turn per step, each answered "+"; P("+") against "-" before each "+"."""

    name = "rlhflow"
    uses_lm_head = True

    def __init__(self, tokenizer: Tokenizer, trust_special_tokens: bool = False):
        self.plus_id = tokenizer.encode("+")[-1]
        self.minus_id = tokenizer.encode("-")[-1]
        if self.plus_id == self.minus_id:
            raise ValueError(f"{self.name}: '+' and '-' encode to the same token")
        self._turn_before, self._turn_after = self._step_turn(tokenizer)
        self._first_piece = functools.lru_cache(maxsize=1024)(self._render_first_piece)
        super().__init__(tokenizer, trust_special_tokens)

    def messages(self, question: str, steps: Sequence[str]) -> list[dict[str, str]]:
        chat = []
        for k, step in enumerate(steps):
            chat.append({"role": "user", "content": f"{question} {step.strip()}" if k == 0 else step.strip()})
            chat.append({"role": "assistant", "content": "+"})
        return chat

    def step_pieces(self, question: str, steps: Sequence[str]) -> list[ChatText]:
        first = self._first_piece(question, steps[0])  # header, first user turn, first "+" turn
        before, after = ChatText.template(self._turn_before), ChatText.template(self._turn_after)
        return [first] + [before + ChatText.content(step.strip()) + after for step in steps[1:]]

    def _render_first_piece(self, question: str, step: str) -> ChatText:
        return self.render_text(question, [step])

    def _step_turn(self, tokenizer: Tokenizer) -> tuple[str, str]:
        """The template's text around a later step: (before the step text, after it through the "+" turn)."""
        one = tokenizer.apply_chat_template(self.messages("Q", ["S"]), add_generation_prompt=False)
        two = tokenizer.apply_chat_template(self.messages("Q", ["S", PLACEHOLDER]), add_generation_prompt=False)
        before, found, after = two[len(one):].partition(PLACEHOLDER)
        if not two.startswith(one) or not found:
            raise ValueError(f"{self.name}: the chat template does not render one step's turns as a prefix")
        return before, after

    def score_index(self, piece_ids: Sequence[int]) -> int:
        plus_indices = [i for i, token in enumerate(piece_ids) if token == self.plus_id]
        if not plus_indices or plus_indices[-1] == 0:
            raise ValueError(f"{self.name}: a step piece must hold the assistant's '+' token")
        return plus_indices[-1] - 1  # the position that predicts the assistant's "+"

    def scores(self, readouts: torch.Tensor) -> list[float]:
        pair = readouts[:, [self.plus_id, self.minus_id]]  # [steps, 2]
        return torch.softmax(pair, dim=-1)[:, 0].float().tolist()


FORMATS: dict[str, type[PRMFormat]] = {fmt.name: fmt for fmt in (QwenMathPRMFormat, RLHFlowFormat)}
FORMAT_OF_ARCHITECTURE = {"Qwen2ForProcessRewardModel": "qwen-math-prm", "LlamaForCausalLM": "rlhflow"}


def format_name_for(hf_config: dict) -> str:
    """The format a checkpoint's config.json implies (its `architectures`)."""
    for architecture in hf_config.get("architectures") or []:
        if architecture in FORMAT_OF_ARCHITECTURE:
            return FORMAT_OF_ARCHITECTURE[architecture]
    raise ValueError(f"no PRM format for architectures {hf_config.get('architectures')}; "
                     f"pass one of {sorted(FORMATS)} explicitly")


def make_format(tokenizer: Tokenizer, hf_config: dict, name: str | None = None,
                trust_special_tokens: bool = False) -> PRMFormat:
    """The named format, or the one config.json implies when name is None."""
    name = name or format_name_for(hf_config)
    if name not in FORMATS:
        raise ValueError(f"unknown PRM format {name!r}; known: {sorted(FORMATS)}")
    return FORMATS[name](tokenizer, trust_special_tokens=trust_special_tokens)
