"""The request bodies the server accepts: OpenAI's chat and text completion fields plus a `search` object.

Models are strict (no "2" for 2, no "yes" for true) so a wrong type is a 400 that names the field.
Unknown top-level fields are ignored, as OpenAI-compatible servers do; the `search` object is ours, so
an unknown key there is an error (a typo would otherwise silently change nothing). Fields OpenAI
defines but a step search cannot honour (stop strings, logprobs, tools and the older functions,
tool_choice / function_call, penalties) are accepted only at their neutral values (absent, empty,
"none"); `unsupported_fields` names the first one set otherwise.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from specscale.config import AGGREGATIONS, LV_POLICIES

MAX_SEED = 2**63 - 1
ANSWER_SELECTIONS = ("best", "weighted_vote", "majority_vote")

# The typed HTTP surface of `SearchConfig`: the fields a request may set, each by a field of the same name —
# of the `search` object, or top-level (sampling) — plus the per-step token cap (max_tokens /
# max_completion_tokens). SearchConfig validates every value; `search.preset` may set any other field
# (`preset[field=value,...]`).
SEARCH_CONFIG_FIELDS = ("beam_size", "beam_width", "max_rounds", "aggregation", "speculation_depth", "lv_policy",
                        "filter_duplicates")
SAMPLING_CONFIG_FIELDS = ("temperature", "top_p", "seed")
STEP_TOKENS_PARAM = "max_tokens"  # sets SearchConfig.max_step_tokens


class SearchOptions(BaseModel):
    """The `search` extension object. None keeps the preset's (or the server's) value. preset: a preset or
    `preset[field=value,...]` (search/presets.py). The SEARCH_CONFIG_FIELDS are SearchConfig's, checked there.

    timeout_s: this request's time budget (capped by the server's --request-timeout)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    preset: str | None = None
    beam_size: int | None = None
    beam_width: int | None = None
    max_rounds: int | None = None
    aggregation: Literal[AGGREGATIONS] | None = None  # type: ignore[valid-type]
    answer_selection: Literal[ANSWER_SELECTIONS] = "best"  # type: ignore[valid-type]
    speculation_depth: int | None = Field(None, le=8)  # the server's own cap
    lv_policy: Literal[LV_POLICIES] | None = None  # type: ignore[valid-type]
    filter_duplicates: bool | None = None
    timeout_s: float | None = Field(None, gt=0)


def param_of(config_field: str) -> str:
    """The request field that sets a SearchConfig field: `search.<name>`, a sampling field, the step cap, or
    `search.preset` (whose brackets set the rest)."""
    if config_field in SEARCH_CONFIG_FIELDS:
        return f"search.{config_field}"
    if config_field in SAMPLING_CONFIG_FIELDS:
        return config_field
    return STEP_TOKENS_PARAM if config_field == "max_step_tokens" else "search.preset"


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    include_usage: bool = False


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class SamplingFields(BaseModel):
    """What both endpoints share: sampling that maps onto the search, and the OpenAI fields a step
    search cannot honour (accepted at their neutral values only)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1)
    max_tokens: int | None = Field(None, ge=1)  # per step
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    search: SearchOptions = Field(default_factory=SearchOptions)

    stop: str | list[str] | None = None
    logprobs: bool | int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def per_step_tokens(self) -> int | None:
        return self.max_tokens

    def config_overrides(self) -> dict:
        """The SearchConfig fields this request sets (SEARCH_CONFIG_FIELDS, SAMPLING_CONFIG_FIELDS, the step cap)."""
        values = {name: getattr(self.search, name) for name in SEARCH_CONFIG_FIELDS}
        values |= {name: getattr(self, name) for name in SAMPLING_CONFIG_FIELDS}
        values["max_step_tokens"] = self.per_step_tokens()
        return {name: value for name, value in values.items() if value is not None}

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def unsupported_fields(self) -> tuple[str, str] | None:
        """(field, why) of the first OpenAI field set to something a step search cannot do."""
        if self.stop:
            return "stop", "stop strings are not supported: steps end at a blank line and paths at EOS"
        if self.logprobs:
            return "logprobs", "logprobs are not supported"
        if self.presence_penalty or self.frequency_penalty:
            name = "presence_penalty" if self.presence_penalty else "frequency_penalty"
            return name, f"{name} is not supported (only 0)"
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported"
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed with stream: true"
        return None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(None, ge=1)  # per step; OpenAI's newer name for max_tokens
    tools: list[dict] | None = None
    functions: list[dict] | None = None
    tool_choice: str | dict | None = None
    function_call: str | dict | None = None
    response_format: dict | None = None
    top_logprobs: int | None = None

    def per_step_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def unsupported_fields(self) -> tuple[str, str] | None:
        tool_fields = {"tools": self.tools, "functions": self.functions, "tool_choice": self.tool_choice,
                       "function_call": self.function_call}
        for name, value in tool_fields.items():
            if value and value != "none":
                return name, "tool calls are not supported"
        if self.response_format and self.response_format.get("type", "text") != "text":
            return "response_format", "only response_format {\"type\": \"text\"} is supported"
        if self.top_logprobs:
            return "top_logprobs", "logprobs are not supported"
        return super().unsupported_fields()


class CompletionRequest(SamplingFields):
    """`prompt` is the question: the server applies the generator's chat template (with its system
    prompt) to it, exactly as for a one-message chat, because the PRM scores (question, steps)."""

    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def unsupported_fields(self) -> tuple[str, str] | None:
        if self.echo:
            return "echo", "echo is not supported"
        if self.suffix:
            return "suffix", "suffix is not supported"
        if self.best_of is not None and self.best_of != self.n:
            return "best_of", "best_of is not supported: use search.beam_size (paths searched) and n (returned)"
        return super().unsupported_fields()
