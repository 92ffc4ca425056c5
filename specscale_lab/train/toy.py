"""Regenerate the bundled toy checkpoints: tokenizer, generator, PRM, all from one seed.

``train_toy(out, seed, recipe)`` writes ``out/toy-generator`` and ``out/toy-prm``, two Hugging Face
folders (``config.json``, ``model.safetensors`` in bf16, ``tokenizer.json``, ``tokenizer_config.json``
with a ChatML ``chat_template``; ``generation_config.json`` for the generator) plus a
``training.json`` per folder with the recipe and measured times. The generator's folder is written as
soon as it is trained, before the PRM's run, so that ``--generator-from`` can resume from it.
``python -m specscale_lab.train toy`` runs it into a new ``runs/toy-<date>-<time>`` folder (``--out
specscale/assets``: into the package's ``assets`` folder, replacing the bundled models).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from specscale_lab.tasks.toy import GENERATOR_SYSTEM_PROMPT, PRM_SYSTEM_PROMPT, toy_problems
from specscale_lab.tasks.toy_solutions import render_solution
from specscale_lab.train.generator import GeneratorRecipe, train_generator
from specscale_lab.train.prm import PrmRecipe, train_prm
from specscale_lab.train.tokenizer import BOS_PAD_TOKEN, build_tokenizer, save_tokenizer

GENERATOR_DIR = "toy-generator"
PRM_DIR = "toy-prm"


@dataclass(frozen=True)
class ToyRecipe:
    """The whole recipe of the bundled toy models."""

    vocab_size: int = 512
    tokenizer_problems: int = 3000
    generator: GeneratorRecipe = field(default_factory=GeneratorRecipe)
    prm: PrmRecipe = field(default_factory=PrmRecipe)
    threads: int = 2


def tokenizer_corpus(n_problems: int, seed: int) -> list[str]:
    """Questions, rendered solutions, prompts and chat role names the BPE merges are learnt from."""
    rng = random.Random(f"tokenizer-{seed}")
    texts = [GENERATOR_SYSTEM_PROMPT, PRM_SYSTEM_PROMPT, "system user assistant"] * 100
    for problem in toy_problems("train", n_problems, seed):
        texts += [problem.question, render_solution(problem, rng)]
    return texts


def train_toy(out: Path, seed: int = 0, recipe: ToyRecipe = ToyRecipe(), log=print,
              generator_from: Path | None = None) -> dict[str, float]:
    """Train both models and write their folders under ``out``; returns the stage times in seconds.
    With ``generator_from`` (a toy-generator folder) the generator and its tokenizer are loaded from
    there, copied to ``out``, and only the PRM is trained."""
    torch.set_num_threads(recipe.threads)
    times: dict[str, float] = {}
    started = time.perf_counter()
    gen_dir, prm_dir = out / GENERATOR_DIR, out / PRM_DIR
    raw = (Tokenizer.from_file(str(generator_from / "tokenizer.json")) if generator_from
           else build_tokenizer(tokenizer_corpus(recipe.tokenizer_problems, seed), recipe.vocab_size))
    save_tokenizer(raw, gen_dir, GENERATOR_SYSTEM_PROMPT)
    save_tokenizer(raw, prm_dir, PRM_SYSTEM_PROMPT)
    gen_tokenizer, prm_tokenizer = AutoTokenizer.from_pretrained(gen_dir), AutoTokenizer.from_pretrained(prm_dir)
    log(f"tokenizer: {raw.get_vocab_size()} tokens")
    times["tokenizer_s"] = time.perf_counter() - started

    generator, generator_record = obtain_generator(gen_tokenizer, recipe, seed, log, generator_from)
    times["generator_s"] = time.perf_counter() - started - sum(times.values())
    if not generator_from:  # on disk before the PRM's long run, so that --generator-from can resume there
        save_generator(copy.deepcopy(generator), gen_tokenizer, gen_dir, dict(generator_record, times=times))
        log(f"generator saved to {gen_dir}")
    prm = train_prm(generator, gen_tokenizer, prm_tokenizer, recipe.prm, seed, log)
    times["prm_s"] = time.perf_counter() - started - sum(times.values())

    save_generator(generator, gen_tokenizer, gen_dir, dict(generator_record, times=generator_record.get("times", times)))
    prm_record = {"seed": seed, "recipe": recipe.prm, "times": times}
    if generator_from:
        prm_record["generator_from"] = "the toy-generator beside it, loaded from its bf16 checkpoint"
    save_model(prm, prm_dir, prm_record)
    times["total_s"] = time.perf_counter() - started
    log("times: " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()))
    return times


def obtain_generator(gen_tokenizer, recipe: ToyRecipe, seed: int, log, generator_from: Path | None):
    """The generator (fp32) and its training record: loaded from ``generator_from``, else trained."""
    if generator_from:
        generator = AutoModelForCausalLM.from_pretrained(generator_from, dtype=torch.float32)
        return generator, json.loads((generator_from / "training.json").read_text())
    return train_generator(gen_tokenizer, recipe.generator, seed, log), {"seed": seed, "recipe": recipe.generator}


def save_generator(generator, tokenizer, folder: Path, record: dict) -> None:
    """The generator's folder: bf16 weights, ``training.json`` and its ``generation_config.json``."""
    save_model(generator, folder, record)
    generation_config(tokenizer).save_pretrained(folder)


def generation_config(tokenizer) -> GenerationConfig:
    """Sampling defaults of the generator: T = 0.8, top-p 1, no top-k, stop at ``<|im_end|>``."""
    pad_id = tokenizer.convert_tokens_to_ids(BOS_PAD_TOKEN)
    return GenerationConfig(
        bos_token_id=pad_id,
        eos_token_id=[tokenizer.eos_token_id, pad_id],
        pad_token_id=pad_id,
        do_sample=True,
        temperature=0.8,
        top_p=1.0,
        top_k=0,
    )


def save_model(model, folder: Path, record: dict) -> None:
    """Save ``model`` in bf16 with ``save_pretrained`` (``config.json`` also gets the classic
    ``torch_dtype`` and ``rope_theta`` keys) and a ``training.json`` record beside it."""
    model.to(torch.bfloat16).save_pretrained(folder)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["torch_dtype"] = "bfloat16"  # the pre-5.0 name of "dtype", read by older loaders
    config.setdefault("rope_theta", config.get("rope_parameters", {}).get("rope_theta", 10000.0))
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (folder / "training.json").write_text(json.dumps(_plain(record), indent=2) + "\n")


def _plain(value):
    if dataclasses.is_dataclass(value):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return round(value, 6)
    return value
