"""The JSON the server answers with: OpenAI's chat / text completion objects and stream chunks, built
from a SearchResult, with SpecScale's extension fields.

Choices are the top-n completed paths, best first (or, for `answer_selection` weighted_vote /
majority_vote, the paths agreeing with the voted answer first). Each choice carries its extension
fields `score`, `step_scores`, `answer` (its \\boxed{} content) and `copies` (identical logical paths
it stands for), and `score_error`: null, or why the PRM did not score every step (the path's PRM input
exceeded the PRM's context; its score then covers the steps that fit). `usage` is honest: completion_tokens counts the tokens of the returned paths only;
`generated_tokens` (everything sampled), `wasted_tokens` (cancelled speculation) and
`search_output_tokens` (all completed paths) are extensions. The `search` object holds the selected
answer, both votes, the rounds, the timings and `early_exit`: null for a search that ran to its end, else
the rule of `search/early_exit.py` that ended it ("settled", "certain" or "stalled"; a stalled search with
no completed path answers with its running paths, docs/design.md "Early exit"). A stream sends a `search_progress` extension per
decided round with an empty delta (so the concatenated deltas are exactly the final answer), then the
paths, an optional usage chunk, and `data: [DONE]`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict

from specscale.search.early_exit import ExitedResult
from specscale.search.result import CompletedPath, SearchResult
from specscale.server.engine_loop import RoundProgress
from specscale.server.search_builder import PreparedSearch

DONE = "data: [DONE]\n\n"


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def ranked_paths(result: SearchResult, answer_selection: str) -> list[CompletedPath]:
    if answer_selection == "best":
        return list(result.paths)
    answer = selected_answer(result, answer_selection)
    agreeing = [p for p in result.paths if p.answer == answer]
    return agreeing + [p for p in result.paths if p.answer != answer]


def selected_answer(result: SearchResult, answer_selection: str) -> str | None:
    return {"best": result.answer, "weighted_vote": result.weighted_vote,
            "majority_vote": result.majority_vote}[answer_selection]


def usage(result: SearchResult, returned: list[CompletedPath]) -> dict:
    completion = sum(p.num_tokens for p in returned)
    return {
        "prompt_tokens": result.usage.prompt_tokens, "completion_tokens": completion,
        "total_tokens": result.usage.prompt_tokens + completion,
        "generated_tokens": result.usage.generated_tokens, "wasted_tokens": result.usage.wasted_tokens,
        "search_output_tokens": result.usage.output_tokens,
    }


def search_summary(prepared: PreparedSearch, result: SearchResult) -> dict:
    return {
        "preset": prepared.preset, "answer_selection": prepared.answer_selection,
        "answer": selected_answer(result, prepared.answer_selection), "best_answer": result.answer,
        "weighted_vote": result.weighted_vote, "majority_vote": result.majority_vote,
        "rounds": result.rounds, "completed_paths": sum(p.copies for p in result.paths),
        "timings": asdict(result.timings), "early_exit": early_exit(result),
    }


def early_exit(result: SearchResult) -> str | None:
    """The exit rule that ended the search early, or None when it ran until its selection ended it."""
    return result.early_exit if isinstance(result, ExitedResult) else None


def path_fields(path: CompletedPath) -> dict:
    return {"score": path.score, "step_scores": list(path.step_scores), "answer": path.answer,
            "copies": path.copies, "score_error": path.score_error}


class CompletionFormat:
    """Chat (`chat.completion`) or text (`text_completion`) objects; they differ in names and choice shape."""

    def __init__(self, chat: bool):
        self.chat = chat
        self.object = "chat.completion" if chat else "text_completion"
        self.chunk_object = "chat.completion.chunk" if chat else "text_completion"
        self.id_prefix = "chatcmpl-" if chat else "cmpl-"

    # ---- whole responses ------------------------------------------------------------------------------
    def response(self, prepared: PreparedSearch, result: SearchResult) -> dict:
        paths = ranked_paths(result, prepared.answer_selection)[:prepared.n]
        choices = [dict(self._full_choice(i, p.text), finish_reason=p.finish_reason, **path_fields(p))
                   for i, p in enumerate(paths)]
        return dict(self._header(prepared, self.object), choices=choices, usage=usage(result, paths),
                    search=search_summary(prepared, result))

    def _full_choice(self, index: int, text: str) -> dict:
        if self.chat:
            return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": None}
        return {"index": index, "text": text, "logprobs": None}

    # ---- stream chunks ----------------------------------------------------------------------------------
    def opening_chunk(self, prepared: PreparedSearch) -> str:
        return self._chunk(prepared, [self._delta_choice(0, "", role=True)])

    def progress_chunk(self, prepared: PreparedSearch, progress: RoundProgress) -> str:
        body = self._chunk_body(prepared, [self._delta_choice(0, None)])
        body["search_progress"] = {"round": progress.round, "best_path": progress.best_path,
                                   "best_score": progress.best_score, "retained": progress.retained}
        return sse(body)

    def final_chunks(self, prepared: PreparedSearch, result: SearchResult) -> list[str]:
        """Per path: its text as one delta, then its finish chunk (with its extension fields); the last
        finish chunk also carries the `search` summary. Then the usage chunk (choices: []) if asked."""
        paths = ranked_paths(result, prepared.answer_selection)[:prepared.n]
        bodies = []
        for i, path in enumerate(paths):
            bodies.append(self._chunk_body(prepared, [self._delta_choice(i, path.text, role=i > 0)]))
            finish = dict(self._delta_choice(i, None), finish_reason=path.finish_reason, **path_fields(path))
            bodies.append(self._chunk_body(prepared, [finish]))
        if not paths:  # no path completed: close choice 0 empty
            bodies.append(self._chunk_body(prepared, [dict(self._delta_choice(0, None), finish_reason="stop")]))
        bodies[-1]["search"] = search_summary(prepared, result)
        if prepared.include_usage:
            bodies.append(dict(self._chunk_body(prepared, []), usage=usage(result, paths)))
        return [sse(body) for body in bodies]

    def _delta_choice(self, index: int, text: str | None, role: bool = False) -> dict:
        if self.chat:
            delta = {} if text is None else {"content": text}
            if role:
                delta = {"role": "assistant", **delta}
            return {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        return {"index": index, "text": text or "", "logprobs": None, "finish_reason": None}

    def _chunk(self, prepared: PreparedSearch, choices: list[dict]) -> str:
        return sse(self._chunk_body(prepared, choices))

    def _chunk_body(self, prepared: PreparedSearch, choices: list[dict]) -> dict:
        return dict(self._header(prepared, self.chunk_object), choices=choices)

    def _header(self, prepared: PreparedSearch, object_name: str) -> dict:
        return {"id": self.id_prefix + prepared.request_id, "object": object_name, "created": int(time.time()),
                "model": prepared.model}
