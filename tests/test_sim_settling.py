"""The simulated PRM's answer-settling parameters (docs/simulator.md, "Answer settling"): `step_persistence`, an
AR(1) chain of a path's score noise from step to step, and `step_drift`, a change of the logits' mean per step.
At 0 (every preset) the scores are the default model's; at phi consecutive steps of one class correlate by phi;
identical prefixes score identically whatever else was scored."""

import math
import statistics
from dataclasses import replace
from itertools import pairwise

import pytest

from specscale.sim.synthetic_prm import SyntheticPRM
from specscale.sim.tokenizer import SyntheticTokenizer
from specscale.sim.workload import TOY, PRMScoreParams, preset
from specscale.verify.formats import make_format

FORMATS = (("qwen-math-prm", "chatml"), ("rlhflow", "llama3"))


def path_inputs(tokenizer: SyntheticTokenizer, format_name: str, path: int, steps: int = 5):
    """A sound path's PRM input (steps opening with sound openers, 6 words each) and its score positions."""
    fmt = make_format(tokenizer, {}, name=format_name)
    texts = []
    for j in range(steps):
        words = [tokenizer.words[(path * 31 + j * 7 + k * 13) % len(tokenizer.words)] for k in range(6)]
        texts.append(tokenizer.decode([tokenizer.good_openers[(path + j) % 8], *words]))
    question = tokenizer.decode([tokenizer.question_ids[(path * 17 + k) % 200] for k in range(8)])
    encoded = fmt.encode(question, texts)
    return fmt, question, texts, list(encoded.token_ids), encoded.score_positions


def prm(params: PRMScoreParams, format_name: str = "qwen-math-prm", template: str = "chatml") -> SyntheticPRM:
    return SyntheticPRM(params, SyntheticTokenizer(template), format_name, seed=0)


def sound_params(**changes) -> PRMScoreParams:
    """The toy PRM without exact 1.0 scores, so every readout is the continuous part."""
    return replace(TOY.prm, perfect_share_sound=0.0, perfect_share_erred=0.0, **changes)


@pytest.mark.parametrize("format_name,template", FORMATS)
def test_at_zero_the_scores_are_the_default_models(format_name, template):
    base = preset("math500", "qwen2.5-7b-instruct", "qwen2.5-math-prm-7b").prm
    default, zero = prm(base, format_name, template), prm(replace(base, step_persistence=0.0, step_drift=0.0),
                                                          format_name, template)
    for path in range(20):
        _, _, _, ids, positions = path_inputs(default.tokenizer, format_name, path)
        assert [default.score(ids, p) for p in positions] == [zero.score(ids, p) for p in positions]
    assert base.step_persistence == 0.0 and base.step_drift == 0.0 and TOY.prm.step_persistence == 0.0


@pytest.mark.parametrize("format_name,template", FORMATS)
def test_a_readout_finds_the_earlier_steps_score_positions(format_name, template):
    model = prm(sound_params(step_persistence=0.7), format_name, template)
    _, _, _, ids, positions = path_inputs(model.tokenizer, format_name, 3)
    starts = [i for i, token in enumerate(ids) if token in model.opener_ids]
    assert [model._score_position(ids, b, e) for b, e in pairwise(starts)] == list(positions[:-1])


@pytest.mark.parametrize("format_name,template", FORMATS)
def test_identical_prefixes_score_identically_and_a_step_keeps_its_score_as_the_path_grows(format_name, template):
    model = prm(replace(TOY.prm, step_persistence=0.7, step_drift=-0.4), format_name, template)
    fmt, question, texts, ids, positions = path_inputs(model.tokenizer, format_name, 5)
    whole = [model.score(ids, p) for p in positions]
    assert whole == [model.score(list(ids), p) for p in positions]  # a fresh copy of the same prefix
    for j in range(len(texts)):  # scored as the path's last step, then with later steps after it
        shorter = fmt.encode(question, texts[: j + 1])
        assert model.score(list(shorter.token_ids), shorter.score_positions[-1]) == whole[j]


def consecutive_logits(phi: float, paths: int = 600, drift: float = 0.0) -> list[tuple[float, float]]:
    model = prm(sound_params(step_persistence=phi, step_drift=drift))
    pairs = []
    for path in range(paths):
        _, _, _, ids, positions = path_inputs(model.tokenizer, "qwen-math-prm", path, steps=3)
        logits = [math.log(s / (1 - s)) for s in (model.score(ids, p) for p in positions)]
        pairs += list(pairwise(logits))
    return pairs


@pytest.mark.parametrize("phi", [0.0, 0.4, 0.7, 0.9])
def test_consecutive_steps_of_one_class_correlate_by_step_persistence(phi):
    pairs = consecutive_logits(phi)
    assert abs(statistics.correlation(*zip(*pairs, strict=True)) - phi) < 0.08


def test_step_drift_moves_the_mean_per_step_and_keeps_the_spread():
    flat, drifting = consecutive_logits(0.0, paths=300), consecutive_logits(0.0, paths=300, drift=-0.5)
    assert [b - a for (a, _), (b, _) in zip(flat[::2], drifting[::2], strict=True)] == pytest.approx([0.0] * 300, abs=1e-9)
    assert [b - a for (_, a), (_, b) in zip(flat[::2], drifting[::2], strict=True)] == pytest.approx([-0.5] * 300, abs=1e-9)


@pytest.mark.parametrize("changes,message", [
    (dict(step_persistence=1.0), "step_persistence must be in \\[0, 1\\)"),
    (dict(step_persistence=-0.1), "step_persistence must be in \\[0, 1\\)"),
    (dict(step_drift=math.nan), "step_drift must be a finite"),
])
def test_a_bad_value_is_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        replace(TOY.prm, **changes)


def test_the_parameters_round_trip_through_a_workload_json():
    workload = replace(TOY, prm=replace(TOY.prm, step_persistence=0.7, step_drift=-0.4))
    assert type(workload).from_json(workload.to_json()) == workload
