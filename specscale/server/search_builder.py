"""SearchBuilder: a validated OpenAI request → a `PreparedSearch` (the runtime's `SearchRequest` plus how
to answer), or an `APIError` naming the field at fault.

The generator prompt is the chat template applied to the messages (the server's system prompt is put
first when the request has none, as search-and-learn does), special-token text in the messages read
as plain text unless the server trusts its callers (chat_text.py); the PRM scores (question, steps) where the
question is the last user message. Sampling fields map onto the search: temperature, top_p, seed, and
max_tokens as the per-step token cap. The preset (`preset[field=value,...]` too), beam size / width, rounds
and aggregation come from the `search` object (`server/protocol.py` declares which SearchConfig fields a
request sets). SearchConfig checks every value, its error becoming a 400 naming the request's field; the
server's own limits (beam size cap, n within the beam, context, time budget) are checked here.
"""

from __future__ import annotations

from dataclasses import dataclass

import jinja2

from specscale.chat_text import render_chat_text
from specscale.config import SearchConfig
from specscale.prompts import chat_messages
from specscale.runtime.runtime import SearchRequest
from specscale.search.presets import preset_config
from specscale.server.errors import APIError
from specscale.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
    param_of,
)
from specscale.server.settings import ServerSettings
from specscale.stack import Stack


@dataclass(frozen=True)
class PreparedSearch:
    request: SearchRequest
    preset: str
    n: int
    answer_selection: str
    timeout_s: float
    stream: bool
    include_usage: bool
    model: str

    @property
    def request_id(self) -> str:
        return self.request.request_id


class SearchBuilder:
    """tokenizer: the generator's; context_tokens: its context; prm_format / prm_context_tokens: how the
    PRM reads a question and how much it can read."""

    def __init__(self, tokenizer, system_prompt: str, context_tokens: int, prm_format, prm_context_tokens: int,
                 settings: ServerSettings):
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.context_tokens = context_tokens
        self.prm_format = prm_format
        self.prm_context_tokens = prm_context_tokens
        self.settings = settings

    @classmethod
    def for_stack(cls, stack: Stack, system_prompt: str, settings: ServerSettings) -> SearchBuilder:
        """The builder of a stack's models: the generator's tokenizer and context, the PRM's format and
        context as the verifier seam carries them (runtime/backend.py)."""
        return cls(stack.tokenizer, system_prompt, stack.context_tokens, stack.verifier.format,
                   stack.verifier.max_input_tokens, settings)

    # ---- endpoints ------------------------------------------------------------------------------
    def chat(self, body: ChatCompletionRequest, request_id: str) -> PreparedSearch:
        self._check_common(body)
        question, prompt_ids = self._chat_prompt(body.messages)
        return self._prepare(body, question, prompt_ids, request_id)

    def completion(self, body: CompletionRequest, request_id: str) -> PreparedSearch:
        self._check_common(body)
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise APIError(400, f"prompt: a list of {len(prompt)} prompts; send one prompt per request",
                               "prompt")
            prompt = prompt[0]
        if not prompt.strip():
            raise APIError(400, "prompt: the question must not be empty", "prompt")
        ids = self._encode_chat(chat_messages(prompt, self.system_prompt), "prompt")
        self._check_question_fits_prm(prompt, "prompt")
        return self._prepare(body, prompt, ids, request_id)

    # ---- checks ---------------------------------------------------------------------------------
    def _check_common(self, body: SamplingFields) -> None:
        if body.model is not None and body.model != self.settings.served_model_name:
            raise APIError(404, f"model: the model {body.model!r} does not exist; this server serves "
                           f"{self.settings.served_model_name!r}", "model", "model_not_found")
        unsupported = body.unsupported_fields()
        if unsupported is not None:
            field, why = unsupported
            raise APIError(400, f"{field}: {why}", field, "unsupported_parameter")

    def _search_config(self, body: SamplingFields) -> tuple[str, SearchConfig]:
        """The request's SearchConfig: its preset (or the server's default) with the fields it sets, every value
        checked by SearchConfig; then the server's own limits."""
        preset = body.search.preset or self.settings.default_preset
        self._check_preset(preset)
        overrides = body.config_overrides()
        try:
            config = preset_config(preset, **overrides)
        except ValueError as error:  # SearchConfig's message starts with the field at fault
            param = param_of(_field_named_by(error))
            raise APIError(400, f"{param}: {error}", param) from error
        self._check_limits(config, body.n)
        return preset, config

    @staticmethod
    def _check_preset(preset: str) -> None:
        """A preset or `preset[field=value,...]` the one parser (search/presets.py) accepts, or a 400."""
        try:
            preset_config(preset)
        except ValueError as error:
            raise APIError(400, f"search.preset: {error}", "search.preset", "unknown_preset") from error

    def _check_limits(self, config: SearchConfig, n: int) -> None:
        if config.beam_size > self.settings.max_beam_size:
            raise APIError(400, f"search.beam_size: {config.beam_size} is above this server's limit of "
                           f"{self.settings.max_beam_size}", "search.beam_size", "beam_size_too_large")
        if n > config.beam_size:
            raise APIError(400, f"n: {n} paths asked for, but the search keeps only beam_size = {config.beam_size}",
                           "n")

    # ---- prompts ----------------------------------------------------------------------------------
    def _chat_prompt(self, messages: list[ChatMessage]) -> tuple[str, list[int]]:
        if not messages:
            raise APIError(400, "messages: must contain at least one message", "messages")
        if messages[-1].role != "user":
            raise APIError(400, f"messages: the last message must be the user's question, not a "
                           f"{messages[-1].role!r} message", "messages")
        question = messages[-1].text()
        if not question.strip():
            raise APIError(400, "messages: the question (the last user message) is empty", "messages")
        turns = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in messages]
        if turns[0]["role"] != "system":
            turns.insert(0, {"role": "system", "content": self.system_prompt})
        ids = self._encode_chat(turns, "messages")
        self._check_question_fits_prm(question, "messages")
        return question, ids

    def _encode_chat(self, turns: list[dict], param: str) -> list[int]:
        try:
            chat = render_chat_text(self.tokenizer, turns, add_generation_prompt=True)
        except jinja2.exceptions.TemplateError as error:
            raise APIError(400, f"{param}: the model's chat template rejects them: {error}", param) from error
        ids = chat.encode(self.tokenizer, trusted=self.settings.trust_special_tokens)
        if len(ids) >= self.context_tokens:
            raise APIError(400, f"{param}: the prompt is {len(ids)} tokens; the model's context is "
                           f"{self.context_tokens} tokens and the search needs room to generate", param,
                           "context_length_exceeded")
        return ids

    def _check_question_fits_prm(self, question: str, param: str) -> None:
        needed = len(self.prm_format.encode(question, ["."]).token_ids)
        if needed >= self.prm_context_tokens:
            raise APIError(400, f"{param}: the question takes {needed} tokens of the PRM's input; its context is "
                           f"{self.prm_context_tokens} tokens", param, "context_length_exceeded")

    def _prepare(self, body: SamplingFields, question: str, prompt_ids: list[int], request_id: str) -> PreparedSearch:
        preset, config = self._search_config(body)
        budget = self.settings.request_timeout_s
        timeout_s = min(body.search.timeout_s or budget, budget)
        return PreparedSearch(
            SearchRequest(question, prompt_ids, config, request_id), preset, body.n, body.search.answer_selection,
            timeout_s, body.stream, body.include_usage(), self.settings.served_model_name,
        )


def _field_named_by(error: ValueError) -> str:
    """The SearchConfig field a validation message names first ("beam_size (6) must be a multiple ...")."""
    return str(error).split(" ", 1)[0]
