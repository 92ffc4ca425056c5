"""Sampling from a generator with plain ``transformers`` (``model.generate``), for data and statistics.

- ``sample_continuations(model, prefixes, n, stop_ids, settings)``: for every token-id prefix, ``n``
  sampled continuations, each ending at the first stop token (kept) or after ``max_new_tokens``.
  With ``stop_ids`` = {``"\\n\\n"``, eos} this samples one reasoning step; with {eos} a whole solution.
Rows are left-padded and batched across prefixes; sampling is temperature sampling with top-p 1 and
no top-k, seeded by ``settings.seed``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingSettings:
    """Temperature sampling as the search uses it (T = 0.8, top-p 1.0, no top-k)."""

    temperature: float = 0.8
    max_new_tokens: int = 512
    batch_rows: int = 96
    seed: int = 0


@torch.inference_mode()
def sample_continuations(
    model, prefixes: list[list[int]], n: int, stop_ids: list[int], pad_id: int, settings: SamplingSettings
) -> list[list[list[int]]]:
    """``n`` continuations (token ids, stop token included) of every prefix."""
    torch.manual_seed(settings.seed)
    per_call = max(1, settings.batch_rows // n)
    out: list[list[list[int]]] = []
    for start in range(0, len(prefixes), per_call):
        out.extend(_sample_chunk(model, prefixes[start : start + per_call], n, stop_ids, pad_id, settings))
    return out


def _sample_chunk(model, prefixes, n, stop_ids, pad_id, settings) -> list[list[list[int]]]:
    width = max(len(p) for p in prefixes)
    ids = torch.full((len(prefixes), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prefix in enumerate(prefixes):
        ids[row, width - len(prefix) :] = torch.tensor(prefix)
        mask[row, width - len(prefix) :] = 1
    generated = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        temperature=settings.temperature,
        top_p=1.0,
        top_k=0,
        max_new_tokens=settings.max_new_tokens,
        num_return_sequences=n,
        eos_token_id=stop_ids,
        pad_token_id=pad_id,
    )[:, width:].tolist()
    rows = [_cut_at_stop(row, stop_ids) for row in generated]
    return [rows[i * n : (i + 1) * n] for i in range(len(prefixes))]


def _cut_at_stop(row: list[int], stop_ids: list[int]) -> list[int]:
    for i, token in enumerate(row):
        if token in stop_ids:
            return row[: i + 1]
    return row
