"""The simulator's workload model: the synthetic tokenizer under the real PRM formats, next-token
distributions that are a function of the prefix (however the state was reached), the distributions the
parameters promise, and the simulated PRM behind the real Verifier."""

import itertools
import math
import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from specscale.engine.sequence import Sequence
from specscale.seam import ScoreRequest
from specscale.sim.problems import make_problems
from specscale.sim.simulation import Simulation, SimulationConfig
from specscale.sim.synthetic_generator import SyntheticGenerator
from specscale.sim.synthetic_prm import SyntheticPRM
from specscale.sim.tokenizer import SyntheticTokenizer
from specscale.sim.workload import (
    DATASETS,
    REFERENCE_TEMPERATURE,
    TOY,
    PRMScoreParams,
    accuracy_for,
    discrete_lognormal,
    hazard,
    preset,
    slip_rates,
)
from specscale.verify.formats import make_format
from specscale_lab.calibration.calibrate import sibling_common_prefix, waiting_ratio

MATH = preset("math500", "qwen2.5-7b-instruct", "qwen2.5-math-prm-7b")
FRESH_IDS = itertools.count(10**9)  # sequence ids never seen by a generator (its state cache is keyed by them)


def sample_path(generator, prompt, rng, max_tokens=400, fresh=False):
    """Tokens drawn one at a time from the generator until EOS: from one sequence advanced token by token,
    or (fresh) from a new sequence object each time, so that every state is scanned from scratch."""
    tokens = list(prompt)
    seq = Sequence(next(FRESH_IDS), tokens, None, 0)
    for _ in range(max_tokens):
        seq = Sequence(next(FRESH_IDS), tokens, None, 0) if fresh else seq
        logits = generator.outputs([(seq, len(tokens) - 1)])[0]
        probs = torch.softmax(logits.double() / REFERENCE_TEMPERATURE, dim=-1).numpy()
        tokens.append(int(rng.choice(len(probs), p=probs / probs.sum())))
        if tokens[-1] == generator.tokenizer.eos:
            break
    return tokens[len(prompt):]


def test_generated_text_tokenizes_back_to_the_same_ids_and_both_prm_formats_accept_the_vocabulary():
    t = SyntheticTokenizer()
    ids = [t.good_openers[2], t.words[3], t.delimiter, t.slip_openers[1], t.words[0], t.delimiter, t.final_good,
           t.words[1], t.answer_ids[7]]
    text = t.decode(ids + [t.eos])
    assert text.endswith("\\boxed{7}") and t.encode(text) == ids
    assert t.token_bytes[t.delimiter] == b"\n\n" and t.token_bytes[t.eos] == b""
    for template, name in (("chatml", "qwen-math-prm"), ("llama3", "rlhflow")):
        fmt = make_format(SyntheticTokenizer(template), {}, name)  # runs the format's template check
        encoded = fmt.encode("L2 q5 q9", [" o1 w2 w3", " x1 w4"])
        assert encoded.num_steps == 2
    assert t.decode(t.encode("text outside the vocabulary 🙂")) == "text outside the vocabulary 🙂"  # byte tokens


def test_logits_are_a_function_of_the_prefix_however_the_state_was_reached():
    tokenizer = SyntheticTokenizer()
    generator = SyntheticGenerator(MATH, tokenizer, seed=3)
    problem = make_problems(MATH, tokenizer, 1, seed=3)[0]
    path = sample_path(generator, problem.prompt_ids, np.random.default_rng(0))
    tokens = list(problem.prompt_ids)
    incremental = Sequence(1, tokens, None, 0)  # one sequence advanced a token at a time (cached state)
    other = SyntheticGenerator(MATH, tokenizer, seed=3)
    for token in path[:-1]:
        tokens.append(token)
        fresh = Sequence(2 + len(tokens), list(tokens), None, 0)  # scanned from scratch by another instance
        position = len(tokens) - 1
        assert torch.equal(generator.outputs([(incremental, position)]), other.outputs([(fresh, position)]))
    rows = set()
    for word in tokenizer.words[:6]:  # other last tokens: other prefixes, other dominant next words
        changed = tokens[:-1] + [word]
        rows.add(tuple(other.outputs([(Sequence(-word, changed, None, 0), len(changed) - 1)])[0].tolist()))
    assert len(rows) >= 5


def test_a_sampled_solution_has_the_promised_shape():
    tokenizer = SyntheticTokenizer()
    generator = SyntheticGenerator(MATH, tokenizer, seed=0)
    rng = np.random.default_rng(1)
    for problem in make_problems(MATH, tokenizer, 5, seed=0):
        path = sample_path(generator, problem.prompt_ids, rng, max_tokens=3000, fresh=True)
        assert path[-1] == tokenizer.eos and path[-2] in tokenizer.answer_ids
        steps = tokenizer.decode(path).split("\n\n")
        assert all(step.split()[0].startswith(("o", "x")) for step in steps[:-1])
        assert steps[-1].split()[0] in ("Therefore", "Hence")
        erred = any(t in tokenizer.slip_ids for t in path)
        boxed = tokenizer.text(path[-2]).strip()
        assert (boxed == f"\\boxed{{{problem.answer}}}") == (not erred)  # correct iff no step erred


def test_distribution_tables_and_the_accuracy_solve():
    pmf = discrete_lognormal(60, 0.3, 2, 1024)
    h = hazard(pmf)
    survival = np.concatenate([[1.0], np.cumprod(1 - h)[:-1]])
    assert np.allclose(survival * h, pmf, atol=1e-12)  # the hazard reproduces the distribution exactly
    assert np.argmax(pmf) + 2 == pytest.approx(60 * math.exp(-0.3**2), abs=2)  # lognormal mode
    rates = slip_rates(MATH)
    base = rates[0] / 0.5
    assert accuracy_for(MATH, base) == pytest.approx(MATH.accuracy, abs=1e-6)
    assert list(rates) == sorted(rates)  # harder levels err more


def test_step_lengths_and_waiting_follow_the_parameters():
    """Steps sampled from the model have the lognormal length the parameters give (a chi-square over
    quantile bins), and the waiting ratio at batch size 1 is the calibrated one."""
    from scipy.stats import chisquare

    params = replace(TOY, step_tokens_median=12.0, step_tokens_sigma=0.4, steps_median=30.0, max_step_tokens=128)
    tokenizer = SyntheticTokenizer()
    generator = SyntheticGenerator(params, tokenizer, seed=0)
    rng = np.random.default_rng(2)
    lengths = []
    for problem in make_problems(params, tokenizer, 14, seed=0):
        steps = tokenizer.decode(sample_path(generator, problem.prompt_ids, rng, 2000)).split("\n\n")[:-1]
        lengths += [len(tokenizer.encode(step)) + 1 for step in steps]  # + the delimiter
    pmf = discrete_lognormal(12.0, 0.4, 2, 128)
    edges = [2, 9, 11, 13, 15, 18, 129]
    expected = np.array([pmf[a - 2:b - 2].sum() for a, b in itertools.pairwise(edges)]) * len(lengths)
    observed = np.histogram(lengths, bins=edges)[0]
    assert len(lengths) > 300 and chisquare(observed, expected).pvalue > 0.001
    for dataset, target in (("gsm8k", 0.20), ("math500", 0.35), ("olympiadbench", 0.55)):
        shape = DATASETS[dataset]
        ratio = waiting_ratio(shape["step_tokens_median"], shape["step_tokens_sigma"], 8)
        assert ratio == pytest.approx(target, abs=0.02)


def test_entropy_controls_the_sibling_common_prefix_and_the_presets_hit_their_targets():
    low = sibling_common_prefix(replace(TOY, top_token_prob=0.8), groups=40)
    high = sibling_common_prefix(replace(TOY, top_token_prob=0.97), groups=40)
    assert low < high
    assert sibling_common_prefix(TOY, groups=80, seed=1) == pytest.approx(0.273, abs=0.05)
    assert sibling_common_prefix(MATH, groups=80, seed=1) == pytest.approx(0.35, abs=0.06)


def test_prm_scores_have_the_promised_shares_and_auc():
    params = PRMScoreParams(perfect_share_sound=0.3, perfect_share_erred=0.05, auc=0.8, sound_logit_mean=2.0,
                            logit_spread=1.2)
    rng = random.Random(0)
    sound = [params.score(False, rng.random(), rng.random()) for _ in range(20000)]
    erred = [params.score(True, rng.random(), rng.random()) for _ in range(20000)]
    assert np.mean([s == 1.0 for s in sound]) == pytest.approx(0.3, abs=0.01)
    assert np.mean([s == 1.0 for s in erred]) == pytest.approx(0.05, abs=0.005)
    below_sound = np.array([s for s in sound if s < 1.0][:3000])
    below_erred = np.array([s for s in erred if s < 1.0][:3000])
    auc = (below_sound[:, None] > below_erred[None, :]).mean()
    assert auc == pytest.approx(0.8, abs=0.02)


@pytest.mark.parametrize("prm", ["qwen2.5-math-prm-7b", "llama3.1-8b-prm-deepseek-data"])
def test_the_real_verifier_reads_the_simulated_scores(prm):
    """Scores through the real Verifier (format, readouts, prefix cache) equal the synthetic PRM's own, exact
    1.0 included; a slip the PRM notices lowers every later step's score class."""
    config = SimulationConfig(generator="qwen2.5-7b-instruct", prm=prm, prm_kv_blocks=4096, generator_kv_blocks=64)
    sim = Simulation(config)
    head = sim.verifier.engine.runner.head_model
    assert isinstance(head, SyntheticPRM) and head.format_name == sim.prm_format
    steps = [" o1 w2 w3\n\n", " o2 w4\n\n", " x3 w5 w6\n\n", " o4 w1\n\n"]
    question = "L3 q1 q2 q3"
    first = sim.verifier.score([ScoreRequest(question, tuple(steps[:k])) for k in range(1, 5)])
    again = sim.verifier.score([ScoreRequest(question, tuple(steps))])  # from the step-prefix cache
    assert again[0].step_scores == first[-1].step_scores
    encoded = sim.verifier.format.encode(question, [s.rstrip("\n") for s in steps])
    direct = tuple(head.score(list(encoded.token_ids), p) for p in encoded.score_positions)
    assert first[-1].step_scores == pytest.approx(direct, abs=1e-6)
    assert all(s == 1.0 for s, d in zip(first[-1].step_scores, direct, strict=True) if d == 1.0)
    sim.close()


def test_perfect_share_is_a_workload_option_of_specscale_simulate():
    """`--perfect-share 0.6` sets the simulated PRM's share of exact 1.0 scores among sound steps (the erred
    steps' share keeps its ratio to it) and says so in the workload's sources; without it the preset's 0.30."""
    from specscale.cli import build_parser
    from specscale_lab.bench.runs import open_simulation
    from specscale_lab.calibration.workload_choice import choose_workload

    base = choose_workload("math500", "qwen2.5-7b-instruct", "qwen2.5-math-prm-7b")
    assert base.prm.perfect_share_sound == 0.30
    for share in (0.1, 0.6):
        workload = choose_workload("math500", "qwen2.5-7b-instruct", "qwen2.5-math-prm-7b", perfect_share=share)
        assert workload.prm.perfect_share_sound == share
        assert workload.prm.perfect_share_erred == pytest.approx(share * 0.03 / 0.30)
        assert "--perfect-share" in workload.sources["perfect_share"]
    args = build_parser().parse_args(["simulate", "throughput", "--out", "x", "--perfect-share", "0.6"])
    sim = open_simulation(args)
    assert sim.workload.prm.perfect_share_sound == 0.6
    sim.close()
