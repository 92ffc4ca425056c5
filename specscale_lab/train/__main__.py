"""Command line of the trainers.

    python -m specscale_lab.train toy [--out DIR] [--seed S] [--smoke] [--generator-from DIR]

``toy`` trains the toy generator and PRM from the seed into ``DIR/toy-generator`` and ``DIR/toy-prm``: by
default a new folder ``runs/toy-<date>-<time>``, so that nothing is overwritten that the user did not name;
``--out specscale/assets`` replaces the bundled models; ``--generator-from DIR`` keeps an existing generator (and
its tokenizer) and trains the PRM only. ``--smoke`` runs the same pipeline with a few optimiser steps
and a handful of sampled problems, to check it end to end in seconds (its models are useless).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from specscale.cli import interrupted_status, interrupted_text, sigterm_interrupts
from specscale_lab.train.loop import TrainPlan
from specscale_lab.train.toy import GENERATOR_DIR, PRM_DIR, ToyRecipe, train_toy

PROG = "python -m specscale_lab.train"
BUNDLED = "specscale/assets"  # where the bundled toy models live in a checkout (ASSETS_DIR)


def smoke_recipe() -> ToyRecipe:
    """The default recipe shrunk to seconds: same code path, tiny step counts and data."""
    recipe = ToyRecipe()
    tiny = TrainPlan(steps=3, lr=1e-3, warmup=1, log_every=1)
    generator = dataclasses.replace(recipe.generator, pretrain=tiny, finetune=tiny, batch_size=4)
    prm = dataclasses.replace(recipe.prm, drill_plan=tiny, plan=tiny, batch_size=4, sampled_problems=2, samples_per_problem=2)
    return dataclasses.replace(recipe, tokenizer_problems=300, generator=generator, prm=prm)


def new_run_folder() -> Path:
    """runs/toy-<date>-<time>: a folder of its own for each run."""
    return Path("runs") / time.strftime("toy-%Y%m%d-%H%M%S")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    toy = sub.add_parser("toy", help="train the toy generator and PRM")
    toy.add_argument("--out", type=Path, default=None,
                     help=f"folder for {GENERATOR_DIR}/ and {PRM_DIR}/ (default: a new runs/toy-<date>-<time>; "
                          f"{BUNDLED} replaces the bundled models)")
    toy.add_argument("--seed", type=int, default=0)
    toy.add_argument("--smoke", action="store_true", help="a few steps only, to test the pipeline")
    toy.add_argument("--generator-from", type=Path, default=None,
                     help="reuse this toy-generator folder (and its tokenizer); train the PRM only")
    args = parser.parse_args(argv)
    out = args.out or new_run_folder()
    print(f"training the toy models into {out}/{GENERATOR_DIR} and {out}/{PRM_DIR}", flush=True)
    with sigterm_interrupts():
        try:
            train_toy(out, args.seed, smoke_recipe() if args.smoke else ToyRecipe(),
                      generator_from=args.generator_from)
        except KeyboardInterrupt as interrupt:
            print(f"\n{PROG} toy: {interrupted_text(interrupt)}", file=sys.stderr)
            return interrupted_status(interrupt)
    print(f"done: use them with --generator {out}/{GENERATOR_DIR} --prm {out}/{PRM_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
