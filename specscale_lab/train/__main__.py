"""Command line of the trainers.

    python -m specscale_lab.train toy [--out DIR] [--seed S] [--smoke] [--generator-from DIR]

``toy`` regenerates the bundled toy generator and PRM (``specscale/assets/toy-generator`` and
``specscale/assets/toy-prm``) from the seed; ``--generator-from DIR`` keeps an existing generator (and
its tokenizer) and trains the PRM only. ``--smoke`` runs the same pipeline with a few optimiser steps
and a handful of sampled problems, to check it end to end in seconds (its models are useless).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from specscale_lab.tasks.toy import ASSETS_DIR
from specscale_lab.train.loop import TrainPlan
from specscale_lab.train.toy import ToyRecipe, train_toy


def smoke_recipe() -> ToyRecipe:
    """The default recipe shrunk to seconds: same code path, tiny step counts and data."""
    recipe = ToyRecipe()
    tiny = TrainPlan(steps=3, lr=1e-3, warmup=1, log_every=1)
    generator = dataclasses.replace(recipe.generator, pretrain=tiny, finetune=tiny, batch_size=4)
    prm = dataclasses.replace(recipe.prm, drill_plan=tiny, plan=tiny, batch_size=4, sampled_problems=2, samples_per_problem=2)
    return dataclasses.replace(recipe, tokenizer_problems=300, generator=generator, prm=prm)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specscale_lab.train", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    toy = sub.add_parser("toy", help="train the bundled toy generator and PRM")
    toy.add_argument("--out", type=Path, default=ASSETS_DIR, help="folder for toy-generator/ and toy-prm/")
    toy.add_argument("--seed", type=int, default=0)
    toy.add_argument("--smoke", action="store_true", help="a few steps only, to test the pipeline")
    toy.add_argument("--generator-from", type=Path, default=None,
                     help="reuse this toy-generator folder (and its tokenizer); train the PRM only")
    args = parser.parse_args(argv)
    train_toy(args.out, args.seed, smoke_recipe() if args.smoke else ToyRecipe(), generator_from=args.generator_from)


if __name__ == "__main__":
    main()
