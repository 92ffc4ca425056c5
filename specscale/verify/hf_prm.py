"""Qwen2.5-Math-PRM in plain ``transformers``: the head class and a reference step scorer.

``Qwen2ForProcessRewardModel`` reproduces the layout of ``Qwen/Qwen2.5-Math-PRM-7B`` (``model`` = a
``Qwen2Model`` body, ``score`` = Linear(h, h) -> ReLU -> Linear(h, 2) on every token's last hidden state;
weights ``model.*``, ``score.0.*``, ``score.2.*``), so a checkpoint in that layout loads with
``Qwen2ForProcessRewardModel.from_pretrained(path)`` without remote code. ``model(input_ids)[0]`` is the
logits tensor ``[batch, seq_len, 2]``.

``score_batch(model, tokenizer, [(question, steps), ...])`` follows the model card: the chat
``system / user question / assistant = steps joined by <extra_0> plus a final <extra_0>`` rendered by
the PRM tokenizer's template, then P(class 1) at every ``<extra_0>``, computed in the model's dtype
(so a bf16 PRM gives scores of exactly 1.0 when it is sure). This is the reference the engine's
verifier is checked against.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen2Config, Qwen2Model, Qwen2PreTrainedModel
from transformers.modeling_outputs import TokenClassifierOutput

from specscale.prompts import PRM_STEP_TAG as STEP_TAG
from specscale.prompts import PRM_SYSTEM_PROMPT


class Qwen2ForProcessRewardModel(Qwen2PreTrainedModel):
    """A Qwen2 body with a two-class token head: the Qwen2.5-Math-PRM architecture."""

    def __init__(self, config: Qwen2Config) -> None:
        super().__init__(config)
        self.num_labels = 2
        self.model = Qwen2Model(config)
        hidden = config.hidden_size
        self.score = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, self.num_labels))
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.embed_tokens = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        **kwargs,
    ) -> TokenClassifierOutput:
        """Logits ``[batch, seq_len, 2]`` for every token (element ``[0]`` of the output); other
        keyword arguments (a KV cache, ``use_cache``) go to the ``Qwen2Model`` body."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            **kwargs,
        )
        return TokenClassifierOutput(logits=self.score(outputs.last_hidden_state))


def prm_messages(question: str, steps: list[str]) -> list[dict[str, str]]:
    """The PRM chat of the model card: the steps joined by ``<extra_0>`` plus a final ``<extra_0>``."""
    return [
        {"role": "system", "content": PRM_SYSTEM_PROMPT},
        {"role": "user", "content": question},
        {"role": "assistant", "content": STEP_TAG.join(steps) + STEP_TAG},
    ]


def prm_input_ids(tokenizer, question: str, steps: list[str]) -> list[int]:
    """Token ids of the rendered PRM chat (template applied with ``add_generation_prompt=False``)."""
    text = tokenizer.apply_chat_template(
        prm_messages(question, steps), tokenize=False, add_generation_prompt=False
    )
    return tokenizer.encode(text, add_special_tokens=False)


@torch.inference_mode()
def score_batch(model, tokenizer, items: list[tuple[str, list[str]]], batch_size: int = 32) -> list[list[float]]:
    """Step scores of each ``(question, steps)`` item: one P(good) per step, in order."""
    tag_id = tokenizer.convert_tokens_to_ids(STEP_TAG)
    pad_id = tokenizer.pad_token_id
    encoded = [prm_input_ids(tokenizer, question, steps) for question, steps in items]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    scores: list[list[float]] = [[] for _ in items]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        width = max(len(encoded[i]) for i in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):
            ids[row, : len(encoded[i])] = torch.tensor(encoded[i])
            mask[row, : len(encoded[i])] = 1
        probs = torch.softmax(model(input_ids=ids, attention_mask=mask)[0], dim=-1)
        for row, i in enumerate(chunk):
            scores[i] = probs[row][(ids[row] == tag_id) & (mask[row] == 1), 1].float().tolist()
    return scores
