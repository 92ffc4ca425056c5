"""Train the toy generator: a tiny ``Qwen2ForCausalLM`` that imitates the fallible student's solutions.

Two stages, like a real model: pretraining on arithmetic drills (``specscale_lab.train.drills``), then
supervised fine-tuning where each example is a fresh train-split problem prompted through the chat
template (generator system prompt + question + generation prompt) followed by one rendered solution
and ``<|im_end|>``; the loss covers the solution and the end token only.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from specscale_lab.tasks.toy import generator_messages, random_problem, split_of
from specscale_lab.tasks.toy_solutions import SlipRates, render_solution
from specscale_lab.train.drills import IGNORE, drill_examples
from specscale_lab.train.loop import TrainPlan, batched, bucketed, pad, train


@dataclass(frozen=True)
class ModelShape:
    """Size of a toy Qwen2 body."""

    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 768
    vocab: int = 512
    context: int = 2048


@dataclass(frozen=True)
class GeneratorRecipe:
    """Everything that defines the generator's training run."""

    shape: ModelShape = field(default_factory=ModelShape)
    pretrain: TrainPlan = field(default_factory=lambda: TrainPlan(steps=600, lr=2e-3, warmup=100))
    finetune: TrainPlan = field(default_factory=lambda: TrainPlan(steps=3000, lr=1.5e-3, warmup=100))
    batch_size: int = 32
    slips: SlipRates = field(default_factory=lambda: SlipRates(hard=0.55))


def qwen2_config(shape: ModelShape, tokenizer, tie_embeddings: bool) -> Qwen2Config:
    """A Qwen2 config of ``shape`` whose special ids come from ``tokenizer``."""
    return Qwen2Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.ffn,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.context,
        max_window_layers=shape.layers,
        rope_theta=10000.0,  # type: ignore[call-arg]  # transformers 5 reads it from **kwargs into rope_parameters
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie_embeddings,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_sliding_window=False,
        attention_dropout=0.0,
    )


def prompt_ids(tokenizer, question: str) -> list[int]:
    """The generation prompt of ``question``: the chat template with ``add_generation_prompt``."""
    text = tokenizer.apply_chat_template(generator_messages(question), tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def train_problems(rng: random.Random) -> Iterator:
    """An endless stream of fresh train-split problems."""
    while True:
        problem = random_problem(rng)
        if split_of(problem.question) == "train":
            yield problem


def lm_examples(tokenizer, rng: random.Random, slips: SlipRates) -> Iterator[tuple[list[int], list[int]]]:
    """``(input_ids, labels)`` pairs: prompt (labels ignored), then a solution and ``<|im_end|>``."""
    for problem in train_problems(rng):
        prompt = prompt_ids(tokenizer, problem.question)
        answer = tokenizer.encode(render_solution(problem, rng, slips), add_special_tokens=False)
        answer.append(tokenizer.eos_token_id)
        yield prompt + answer, [IGNORE] * len(prompt) + answer


def lm_loss(model: Qwen2ForCausalLM, batch: list[tuple[list[int], list[int]]]) -> torch.Tensor:
    ids = pad([ids for ids, _ in batch], 0)
    labels = pad([labels for _, labels in batch], IGNORE)
    mask = pad([[1] * len(ids) for ids, _ in batch], 0)
    return model(input_ids=ids, attention_mask=mask, labels=labels).loss


def train_generator(tokenizer, recipe: GeneratorRecipe, seed: int, log=print) -> Qwen2ForCausalLM:
    """Pretrain a fresh generator on drills, then fine-tune it on solutions; returns it in eval mode."""
    torch.manual_seed(seed)
    rng = random.Random(f"generator-{seed}")
    model = Qwen2ForCausalLM(qwen2_config(recipe.shape, tokenizer, tie_embeddings=True))
    log(f"generator: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters")
    train(model, batched(drill_examples(tokenizer, rng), recipe.batch_size), recipe.pretrain, lm_loss, log)
    examples = lm_examples(tokenizer, rng, recipe.slips)
    batches = bucketed(examples, recipe.batch_size, key=lambda example: len(example[0]))
    train(model, batches, recipe.finetune, lm_loss, log)
    return model
