"""The bundled toy checkpoints: formats, loading with transformers, behaviour, and the stats script."""

import json
import math

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

from specscale.verify.hf_prm import Qwen2ForProcessRewardModel, prm_input_ids, score_batch
from specscale_lab.tasks import toy_stats
from specscale_lab.tasks.toy import (
    PRM_STEP_TAG,
    TOY_GENERATOR_DIR,
    TOY_PRM_DIR,
    generator_messages,
    is_correct,
    label_steps,
    split_steps,
    toy_problems,
)
from specscale_lab.tasks.toy_models import load_toy_models

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<extra_0>")


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(2)
    return load_toy_models()


def _config(folder):
    return json.loads((folder / "config.json").read_text())


def test_checkpoint_folders_are_real_hf_folders():
    for folder in (TOY_GENERATOR_DIR, TOY_PRM_DIR):
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            assert (folder / name).is_file(), folder / name
        assert _config(folder)["model_type"] == "qwen2"
        assert _config(folder)["torch_dtype"] == "bfloat16"
        tok_config = json.loads((folder / "tokenizer_config.json").read_text())
        assert tok_config["eos_token"] == "<|im_end|>"
        assert "<|im_start|>" in tok_config["chat_template"]
    assert (TOY_GENERATOR_DIR / "generation_config.json").is_file()
    assert _config(TOY_GENERATOR_DIR)["architectures"] == ["Qwen2ForCausalLM"]
    assert _config(TOY_PRM_DIR)["architectures"] == ["Qwen2ForProcessRewardModel"]
    assert "auto_map" not in _config(TOY_PRM_DIR)
    total = sum(f.stat().st_size for d in (TOY_GENERATOR_DIR, TOY_PRM_DIR) for f in d.iterdir())
    assert total <= 20 * 2**20


def test_prm_weights_have_the_qwen_math_prm_layout():
    with safe_open(str(TOY_PRM_DIR / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("score.0.weight").dtype == torch.bfloat16
    hidden = _config(TOY_PRM_DIR)["hidden_size"]
    assert {"score.0.weight", "score.0.bias", "score.2.weight", "score.2.bias"} <= names
    assert all(n.startswith(("model.", "score.")) for n in names)
    with safe_open(str(TOY_PRM_DIR / "model.safetensors"), "pt") as f:
        assert tuple(f.get_tensor("score.2.weight").shape) == (2, hidden)


def test_tokenizer_special_tokens_digits_and_step_end():
    for folder in (TOY_GENERATOR_DIR, TOY_PRM_DIR):
        tok = AutoTokenizer.from_pretrained(folder)
        ids = [tok.convert_tokens_to_ids(t) for t in SPECIALS]
        assert len(set(ids)) == 4 and tok.eos_token_id == ids[2] and tok.pad_token_id == ids[0]
        assert len(tok.encode("\n\n", add_special_tokens=False)) == 1
        assert len(tok.encode("12345", add_special_tokens=False)) == 5
        step_end = tok.encode("\n\n", add_special_tokens=False)[0]
        assert step_end in tok.encode("23 + 14 = 37.\n\nThe answer", add_special_tokens=False)
        assert len(tok) <= _config(folder)["vocab_size"] <= 1024
        for token_id in range(len(tok)):
            assert isinstance(tok.decode([token_id]), str)


def test_chat_templates():
    gen = AutoTokenizer.from_pretrained(TOY_GENERATOR_DIR)
    text = gen.apply_chat_template(generator_messages("Q?"), tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "<|im_start|>user\nQ?<|im_end|>\n" in text
    prm = AutoTokenizer.from_pretrained(TOY_PRM_DIR)
    ids = prm_input_ids(prm, "Q?", ["a", "b"])
    rendered = prm.decode(ids)
    assert rendered.endswith("<|im_start|>assistant\na<extra_0>b<extra_0><|im_end|>\n")
    assert "Please reason step by step, and put your final answer within \\boxed{}." in rendered
    assert ids.count(prm.convert_tokens_to_ids(PRM_STEP_TAG)) == 2


def test_both_load_with_transformers(models):
    generator = AutoModelForCausalLM.from_pretrained(TOY_GENERATOR_DIR)
    assert isinstance(generator, Qwen2ForCausalLM)
    prm = Qwen2ForProcessRewardModel.from_pretrained(TOY_PRM_DIR)
    ids = torch.tensor([prm_input_ids(models.prm_tokenizer, "Q?", ["1 + 1 = 2."])])
    logits = prm(input_ids=ids)[0]
    assert logits.shape == (1, ids.shape[1], 2)
    assert 1e6 < sum(p.numel() for p in generator.parameters()) < 1e7


def test_generator_writes_steps_and_a_boxed_answer(models):
    problem = toy_problems("test", 1, seed=0)[0]
    prompt = torch.tensor([models.prompt(problem.question)])
    out = models.generator.generate(input_ids=prompt, do_sample=False, max_new_tokens=300)
    text = models.text(out[0, prompt.shape[1] :].tolist())
    assert out[0, -1].item() == models.gen_tokenizer.eos_token_id
    assert len(split_steps(text)) >= 2 and "\\boxed{" in text


def test_prm_tells_a_right_step_from_a_wrong_one(models):
    """The issue's metric on the generator's own samples: a good and a bad step at the same index of the
    same problem, both after a good prefix. A PRM that only knows how hard a problem is scores 0.5 here
    (0.92 over 300 problems in the model card)."""
    problems = toy_problems("test", 12, seed=3)
    texts = toy_stats.sample_solutions(models, problems, 8, seed=0)
    steps = [[split_steps(t) or [""] for t in candidates] for candidates in texts]
    scores = score_batch(models.prm, models.prm_tokenizer, [(p.question, s) for p, c in zip(problems, steps, strict=True) for s in c])
    scores = [scores[i * 8 : (i + 1) * 8] for i in range(len(problems))]
    labels = [[label_steps(p, s) for s in candidates] for p, candidates in zip(problems, steps, strict=True)]
    metrics = toy_stats.step_metrics(problems, steps, labels, scores)
    assert metrics["within_problem_pairs"] >= 50
    assert metrics["within_problem_auc"] >= 0.8
    assert all(0.0 <= s <= 1.0 for rows in scores for row in rows for s in row)


def test_prm_prefers_a_reference_step_to_its_corrupted_copy(models):
    """Synthetic errors (one wrong result, operand, total, operation or box in a clean solution) are harder
    than the generator's own; chance is 0.5, the model card reports 0.67 over 300 problems."""
    stats = toy_stats.corrupted_pair_metrics(models, toy_problems("test", 60, seed=7), seed=0)
    assert stats["corrupted_pairs"] == 60
    assert stats["corrupted_pair_accuracy"] >= 0.6


def test_stats_quick_mode_gives_sane_numbers(tmp_path):
    stats = toy_stats.main(["--quick", "--problems", "4", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "toy_stats.json").read_text()) == pytest.approx(stats, nan_ok=True)
    for name in ("single", "pass_at_n", "majority", "prm_last", "beam_search_accuracy", "common_prefix_ratio"):
        assert 0.0 <= stats[name] <= 1.0, name
    assert stats["single"] <= stats["pass_at_n"]
    assert 0.0 <= stats["waiting_ratio_median"] < 1.0
    assert 3 <= stats["tokens_per_step_median"] <= 100
    assert stats["steps_per_solution_median"] >= 2
    assert math.isnan(stats["within_problem_auc"]) or 0.0 <= stats["within_problem_auc"] <= 1.0
    assert 0.0 <= stats["perfect_score_fraction"] <= 1.0
    assert stats["problems"] == 4
    shares = [stats[f"events_{low}_{high}_share"] for low, high in toy_stats.DIFFICULTY_BANDS]
    assert sum(shares) == pytest.approx(1.0)


def test_greedy_generator_solves_some_problems(models):
    problems = toy_problems("test", 8, seed=1)
    prompts = [models.prompt(p.question) for p in problems]
    solved = 0
    for problem, prompt in zip(problems, prompts, strict=True):
        out = models.generator.generate(input_ids=torch.tensor([prompt]), do_sample=False, max_new_tokens=300)
        solved += is_correct(problem, models.text(out[0, len(prompt) :].tolist()))
    assert solved >= 2
