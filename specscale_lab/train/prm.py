"""Train the toy PRM: ``Qwen2ForProcessRewardModel`` initialised from the trained generator.

Training data, every label computed by the task's checker (``label_steps``):

- the generator's own sampled solutions to train problems (T = 0.8), the distribution the PRM serves;
- solutions by a student who slips more often than the generator (``SlipRates`` of the recipe);
- corrupted copies of good solutions (one wrong result, operand, running total, operation or box),
  which teach the PRM to tell "11 - 6 = 5" from "11 - 6 = 7" within the same problem;
- verification drills (``specscale_lab.train.drills.verification_drill``): runs of bare equations whose
  result is right half the time, the arithmetic check in its purest form.

Each solution example is the PRM chat of the model card. Besides the step labels at every ``<extra_0>``,
every token of the steps is labelled: good while the text so far has no error, bad from the first wrong
character on (located by the checker's ``first_error``). These dense labels put the learning signal on
the very digit where a step goes wrong; the served scores are read at the ``<extra_0>`` tags only.

Curriculum: the drills alone first (``drill_plan``: the arithmetic check is learnt in a few hundred
steps on its own, slowly inside the mix), then the mix.

The body starts from the generator's weights plus two identity-initialised layers on top (see
``prm_from_generator``), and the ``<extra_0>`` embedding from the ``"\\n\\n"`` embedding it replaces.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from specscale.verify.hf_prm import Qwen2ForProcessRewardModel, prm_messages
from specscale_lab.tasks.hf_sampling import SamplingSettings, sample_continuations
from specscale_lab.tasks.toy import PRM_STEP_TAG, STEP_SEPARATOR, ToyProblem, first_error, label_steps, split_steps
from specscale_lab.tasks.toy_corrupt import corrupt_steps
from specscale_lab.tasks.toy_solutions import NO_SLIPS, SlipRates, render_solution
from specscale_lab.train.drills import verification_drill
from specscale_lab.train.generator import IGNORE, prompt_ids, train_problems
from specscale_lab.train.loop import TrainPlan, batched, bucketed, pad, train


@dataclass(frozen=True)
class PrmRecipe:
    """Everything that defines the PRM's training run."""

    drill_plan: TrainPlan = field(default_factory=lambda: TrainPlan(steps=300, lr=1e-3, warmup=50))
    plan: TrainPlan = field(default_factory=lambda: TrainPlan(steps=3500, lr=1e-3, warmup=100))
    batch_size: int = 32
    sampled_problems: int = 1500
    samples_per_problem: int = 4
    mix: tuple[float, float, float, float] = (0.35, 0.15, 0.3, 0.2)  # sampled, slipped, corrupted, drill
    slips: SlipRates = field(default_factory=lambda: SlipRates(hard=0.5, easy=0.1, misread=0.1))
    extra_layers: int = 2  # verifier layers on top of the generator's body (see prm_from_generator)


@dataclass(frozen=True)
class PrmExample:
    """Token ids of one PRM chat and a label per token: 1 while the solution is still free of errors,
    0 from the first wrong character on, ``IGNORE`` outside the assistant's steps."""

    ids: list[int]
    labels: list[int]


def prm_example(tokenizer, problem: ToyProblem, steps: list[str]) -> PrmExample:
    """The PRM chat of ``steps`` with token labels located by the checker's ``first_error``."""
    text = tokenizer.apply_chat_template(prm_messages(problem.question, steps), tokenize=False)
    content = PRM_STEP_TAG.join(steps) + PRM_STEP_TAG
    start = text.rindex(content)
    end = start + len(content)
    error = first_error(problem, steps)
    error_at = end if error is None else start + sum(len(s) + len(PRM_STEP_TAG) for s in steps[: error[0]]) + error[1]
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    labels = [
        IGNORE if a < start or b > end else int(b <= error_at or error is None)
        for a, b in encoded["offset_mapping"]
    ]
    return PrmExample(encoded["input_ids"], labels)


def sample_generator_solutions(
    generator, gen_tokenizer, problems: list[ToyProblem], n: int, seed: int
) -> list[tuple[ToyProblem, list[str]]]:
    """``n`` sampled solutions (T = 0.8) of each problem, split into steps."""
    prefixes = [prompt_ids(gen_tokenizer, p.question) for p in problems]
    settings = SamplingSettings(max_new_tokens=400, seed=seed)
    outs = sample_continuations(
        generator, prefixes, n, [gen_tokenizer.eos_token_id], gen_tokenizer.pad_token_id, settings
    )
    return [
        (problem, split_steps(gen_tokenizer.decode(ids, skip_special_tokens=True)))
        for problem, rows in zip(problems, outs, strict=True)
        for ids in rows
    ]


def prm_examples(
    tokenizer, sampled: list[tuple[ToyProblem, list[str]]], recipe: PrmRecipe, rng: random.Random
) -> Iterator[PrmExample]:
    """An endless mix of sampled, slipped and corrupted solutions and verification drills, in the
    recipe's proportions."""
    problems = train_problems(rng)
    sources = ("sampled", "slipped", "corrupted", "drill")
    tag_id = tokenizer.convert_tokens_to_ids(PRM_STEP_TAG)
    while True:
        source = rng.choices(sources, recipe.mix)[0]
        if source == "drill":
            yield PrmExample(*verification_drill(tokenizer, rng, tag_id))
            continue
        if source == "sampled":
            problem, steps = rng.choice(sampled)
        elif source == "slipped":
            problem = next(problems)
            steps = split_steps(render_solution(problem, rng, recipe.slips))
        else:
            problem = next(problems)
            steps = corrupt_steps(problem, split_steps(render_solution(problem, rng, NO_SLIPS)), rng)
        if steps:
            yield prm_example(tokenizer, problem, steps)


def make_prm_loss(tag_id: int):
    """Cross-entropy of the two-class head at every labelled token plus, again, at every step tag
    (the positions the PRM is read at)."""

    def loss_fn(model: Qwen2ForProcessRewardModel, batch: list[PrmExample]) -> torch.Tensor:
        ids = pad([ex.ids for ex in batch], 0)
        labels = pad([ex.labels for ex in batch], IGNORE)
        mask = pad([[1] * len(ex.ids) for ex in batch], 0)
        logits = model(input_ids=ids, attention_mask=mask)[0].float()
        at_tags = ids == tag_id
        dense = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
        return dense + F.cross_entropy(logits[at_tags], labels[at_tags])

    return loss_fn


def prm_from_generator(generator, tokenizer, extra_layers: int = 0) -> Qwen2ForProcessRewardModel:
    """A PRM whose body is a copy of the generator's plus ``extra_layers`` fresh layers on top that start
    as the identity (their output projections are zero); ``<extra_0>`` starts as ``"\\n\\n"``.

    Why the extra layers: the generator forms its prediction of a result ("13 + 8 =" -> "21") only in its
    last layer, so in a copy of its body no later layer can compare that prediction with the digits that
    follow. Layers on top can: a query from the written digit meets a key holding the prediction."""
    config = generator.config.__class__.from_dict(generator.config.to_dict())
    config.architectures = ["Qwen2ForProcessRewardModel"]
    config.tie_word_embeddings = False
    layers = config.num_hidden_layers + extra_layers
    config.num_hidden_layers = config.max_window_layers = layers
    config.layer_types = ["full_attention"] * layers
    prm = Qwen2ForProcessRewardModel(config)
    missing = prm.model.load_state_dict(generator.model.state_dict(), strict=False).missing_keys
    assert all(key.startswith("layers.") for key in missing), missing  # only the new layers are fresh
    for layer in prm.model.layers[layers - extra_layers :]:
        torch.nn.init.zeros_(layer.self_attn.o_proj.weight)
        torch.nn.init.zeros_(layer.mlp.down_proj.weight)
    embeddings = prm.model.embed_tokens.weight.data
    step_end = tokenizer.encode(STEP_SEPARATOR, add_special_tokens=False)[0]
    embeddings[tokenizer.convert_tokens_to_ids(PRM_STEP_TAG)] = embeddings[step_end]
    return prm


def train_prm(generator, gen_tokenizer, prm_tokenizer, recipe: PrmRecipe, seed: int, log=print):
    """Sample the generator, then train the PRM from its weights; returns the PRM in eval mode."""
    torch.manual_seed(seed)
    rng = random.Random(f"prm-{seed}")
    problems = list(itertools.islice(train_problems(rng), recipe.sampled_problems))
    sampled = sample_generator_solutions(generator, gen_tokenizer, problems, recipe.samples_per_problem, seed)
    good = sum(all(label_steps(p, s)) for p, s in sampled)
    log(f"prm: {len(sampled)} sampled solutions, {good / len(sampled):.1%} with every step good")
    prm = prm_from_generator(generator, prm_tokenizer, recipe.extra_layers)
    tag_id = prm_tokenizer.convert_tokens_to_ids(PRM_STEP_TAG)
    drills = (PrmExample(*verification_drill(prm_tokenizer, rng, tag_id)) for _ in itertools.count())
    log("prm: verification drills first")
    train(prm, batched(drills, recipe.batch_size), recipe.drill_plan, make_prm_loss(tag_id), log)
    examples = prm_examples(prm_tokenizer, sampled, recipe, rng)
    batches = bucketed(examples, recipe.batch_size, key=lambda ex: len(ex.ids))
    log("prm: solutions and drills")
    train(prm, batches, recipe.plan, make_prm_loss(tag_id), log)
    return prm
