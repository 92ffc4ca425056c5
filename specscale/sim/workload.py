"""The workload model: what the simulated generator writes and what the simulated PRM says, as parameters.

A problem has a difficulty level (1..levels, uniform). A solution is a sequence of steps; each step is an
opener token, words, and the step delimiter "\\n\\n"; the last step opens with a final opener and ends
with a `\\boxed{}` answer and EOS. The generator (`synthetic_generator.py`) draws, all from distributions
that are a deterministic function of the prefix:

- the number of steps: discretised lognormal (median steps_median x the level's step scale, spread
  steps_sigma), as a hazard: at the start of step k, P(this step is the last);
- each step's length in tokens (opener and delimiter included): discretised lognormal (step_tokens_median,
  step_tokens_sigma), as a hazard: after i tokens, P(the step ends now);
- a latent error: every step errs with the level's slip rate (its opener is then a slip token); a path is
  correct iff no step erred, and an erred path's answer is one of the problem's wrong answers (Zipf-weighted,
  so wrong answers cluster as real ones do). The base slip rate is solved so that one sample's accuracy is
  `accuracy`;
- the words: one dominant token of probability top_token_prob (chosen by a hash of the prefix), the rest
  spread evenly. Siblings share a prefix while they draw the same tokens, so this entropy sets the sibling
  common-prefix ratio (`calibrate.py` fits it to a target).

All probabilities hold at the reference temperature 0.8 (the logits are 0.8 x log p); another temperature
sharpens or flattens them as it would a real model's.

The PRM (`synthetic_prm.py`) scores a step from whether its path has erred by then: exactly 1.0 with
probability perfect_share_*, else sigmoid(mean + spread * z), z ~ N(0, 1), the erred mean placed so that the
continuous part separates sound from erred steps with the given AUC. It notices a path's first slip with
probability `detection`, once for the path: an unnoticed error keeps its path scored as sound at every
later step, as a real PRM's misjudgements persist along a path (with independent noise per step and no
misses, beam search would weed out every erred path). With `step_persistence` phi > 0 the noise itself persists:
the continuous part's normal is an AR(1) chain along the path (consecutive steps correlate by phi), which sets
how fast a leader settles across rounds (early exit; docs/simulator.md, "Answer settling"), and `step_drift`
moves the logits' mean by that much per step along a path (a PRM that scores later steps lower).

Presets (`preset`) combine a data set, a generator and a PRM; every number names its source.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from statistics import NormalDist

import numpy as np

REFERENCE_TEMPERATURE = 0.8  # the temperature at which the workload's probabilities hold (search default)
ANSWERS = 16  # distinct answers a problem's solutions can box (the correct one and 15 wrong ones)


@dataclass(frozen=True)
class PRMScoreParams:
    """How the simulated PRM scores a step, given whether its path has erred by that step."""

    perfect_share_sound: float  # share of exact 1.0 scores among steps of paths that have not erred
    perfect_share_erred: float  # ... among steps of paths that have
    auc: float  # P(sound score > erred score) for scores below 1.0
    sound_logit_mean: float  # mean logit of a sound step's score (below 1.0)
    logit_spread: float  # standard deviation of a score's logit within each class
    detection: float = 1.0  # share of erred paths whose error the PRM sees; it scores the others as sound
    partial_correlation: float = 0.0  # within-class correlation of two readouts of one step (docs/simulator.md)
    step_persistence: float = 0.0  # correlation of a path's score noise from one step to the next (AR(1))
    step_drift: float = 0.0  # change of the score logits' mean per step along a path (step j: + j x step_drift)

    def __post_init__(self) -> None:
        for name in ("perfect_share_sound", "perfect_share_erred"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1)")
        if not 0 <= self.detection <= 1:
            raise ValueError("detection must be in [0, 1]")
        if not 0 <= self.partial_correlation <= 1:
            raise ValueError("partial_correlation must be in [0, 1]")
        if not 0 <= self.step_persistence < 1:
            raise ValueError(f"step_persistence must be in [0, 1) (the step-to-step correlation of a path's score "
                             f"noise), got {self.step_persistence}")
        if not math.isfinite(self.step_drift):
            raise ValueError(f"step_drift must be a finite logit change per step, got {self.step_drift}")
        if not 0 < self.auc < 1 or self.logit_spread <= 0:
            raise ValueError("auc must be in (0, 1) and logit_spread positive")

    @property
    def erred_logit_mean(self) -> float:
        """AUC of two normals with equal spread s: Phi((mu_sound - mu_erred) / (s * sqrt 2))."""
        return self.sound_logit_mean - math.sqrt(2) * self.logit_spread * NormalDist().inv_cdf(self.auc)

    def score(self, erred: bool, u_perfect: float, u_value: float) -> float:
        """The score for two independent uniforms in (0, 1); logits are capped at 15 so that only the
        perfect branch gives exactly 1.0 once rounded to float32."""
        if u_perfect < (self.perfect_share_erred if erred else self.perfect_share_sound):
            return 1.0
        return self.score_of(erred, NormalDist().inv_cdf(u_value))

    def score_of(self, erred: bool, z: float, step: int = 0) -> float:
        """The score below 1.0 of a standard normal draw z at a path's step `step` (0: its first; step_drift)."""
        mean = (self.erred_logit_mean if erred else self.sound_logit_mean) + self.step_drift * step
        logit = min(mean + self.logit_spread * z, 15.0)
        return 1.0 / (1.0 + math.exp(-logit))

    def readout_score(self, erred: bool, readout: tuple[float, float], step: tuple[float, float],
                      u_choice: float) -> float:
        """The score of one readout of a step (after part of it, or all of it) from its own uniforms `readout`
        (perfect, value) and the step's `step` (shared by every readout of the step): with partial_correlation
        rho the perfect branch takes the step's draw with probability rho (u_choice < rho) and the logit's normal
        is sqrt(rho) z_step + sqrt(1 - rho) z_readout, so two readouts of one step correlate by rho within a
        class; rho = 0 is exactly `score` of the readout's own uniforms."""
        rho = self.partial_correlation
        if rho == 0:
            return self.score(erred, *readout)
        u_perfect = step[0] if u_choice < rho else readout[0]
        if u_perfect < (self.perfect_share_erred if erred else self.perfect_share_sound):
            return 1.0
        return self.score_of(erred, self.readout_normal(readout, step))

    def readout_normal(self, readout: tuple[float, float], step: tuple[float, float] | None = None) -> float:
        """The standard normal of a readout's continuous part: sqrt(rho) z_step + sqrt(1 - rho) z_readout for
        partial_correlation rho (z_readout alone at rho = 0, or without the step's uniforms)."""
        rho, normal = self.partial_correlation, NormalDist()
        if rho == 0 or step is None:
            return normal.inv_cdf(readout[1])
        return math.sqrt(rho) * normal.inv_cdf(step[1]) + math.sqrt(1 - rho) * normal.inv_cdf(readout[1])

    def persist(self, previous: float | None, fresh: float) -> float:
        """A path's score noise at a step, an AR(1) chain along the path: step_persistence phi carries phi of the
        previous step's normal, sqrt(1 - phi^2) of a fresh one (previous None: the path's first step), so every
        step's normal stays standard and consecutive steps' correlate by phi."""
        phi = self.step_persistence
        if previous is None or phi == 0:
            return fresh
        return phi * previous + math.sqrt(1 - phi * phi) * fresh

    def persistent_score(self, erred: bool, u_perfect: float, z: float, step: int) -> float:
        """The score of a readout of a path's step `step` (0: its first) whose continuous part's normal is z (the
        path's chain, `persist`); the exact-1.0 branch is the readout's own draw, at every step."""
        if u_perfect < (self.perfect_share_erred if erred else self.perfect_share_sound):
            return 1.0
        return self.score_of(erred, z, step)


@dataclass(frozen=True)
class WorkloadParams:
    """A data set x generator x PRM workload; `sources` names where each number comes from."""

    name: str
    accuracy: float  # one sample's chance of a correct answer
    steps_median: float  # steps per solution
    steps_sigma: float
    step_tokens_median: float  # tokens per step, opener and delimiter included
    step_tokens_sigma: float
    top_token_prob: float  # the dominant next word's probability at the reference temperature
    question_tokens_median: float
    question_tokens_sigma: float
    system_prompt_tokens: int
    prm: PRMScoreParams
    levels: int = 5
    wrong_answer_decay: float = 1.0  # Zipf exponent of the wrong answers' weights
    max_steps: int = 40
    max_step_tokens: int = 1024
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.accuracy < 1:
            raise ValueError(f"accuracy must be in (0, 1), got {self.accuracy}")
        if not 0 < self.top_token_prob < 1:
            raise ValueError(f"top_token_prob must be in (0, 1), got {self.top_token_prob}")
        if min(self.steps_median, self.step_tokens_median, self.question_tokens_median) < 1:
            raise ValueError("medians must be >= 1")
        if min(self.steps_sigma, self.step_tokens_sigma, self.question_tokens_sigma) <= 0:
            raise ValueError("sigmas must be positive")
        if self.levels < 1 or self.max_steps < 1 or self.max_step_tokens < 3:
            raise ValueError("levels, max_steps must be >= 1 and max_step_tokens >= 3")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> WorkloadParams:
        return cls(**{**data, "prm": PRMScoreParams(**data["prm"])})


# ---- the distributions, as tables -----------------------------------------------------------------------
def discrete_lognormal(median: float, sigma: float, low: int, high: int) -> np.ndarray:
    """P(X = x) for x in [low, high]: a lognormal's mass on [x - 1/2, x + 1/2), renormalised."""
    x = np.arange(low, high + 1, dtype=float)
    normal = NormalDist(math.log(median), sigma)
    upper = np.array([normal.cdf(math.log(v + 0.5)) for v in x])
    lower = np.array([normal.cdf(math.log(v - 0.5)) if v > 0.5 else 0.0 for v in x])
    mass = np.maximum(upper - lower, 0.0)
    return mass / mass.sum()


def hazard(pmf: np.ndarray) -> np.ndarray:
    """hazard[j] = P(X = j-th value | X >= j-th value); the last entry is 1."""
    survival = np.cumsum(pmf[::-1])[::-1]  # P(X >= x)
    out = np.divide(pmf, survival, out=np.ones_like(pmf), where=survival > 0)
    out[-1] = 1.0
    return np.clip(out, 0.0, 1.0)


def level_step_scale(params: WorkloadParams) -> np.ndarray:
    """Steps median multiplier per level (harder problems take more steps): 0.6 .. 1.4, mean 1."""
    return np.linspace(0.6, 1.4, params.levels) if params.levels > 1 else np.ones(1)


def level_slip_scale(params: WorkloadParams) -> np.ndarray:
    """Per-step slip rate multiplier per level (harder problems err more often): 0.5 .. 1.5, mean 1."""
    return np.linspace(0.5, 1.5, params.levels) if params.levels > 1 else np.ones(1)


def steps_pmf(params: WorkloadParams, level: int) -> np.ndarray:
    """P(K = k) for k = 1..max_steps at a level (1-based)."""
    median = max(params.steps_median * level_step_scale(params)[level - 1], 1.0)
    return discrete_lognormal(median, params.steps_sigma, 1, params.max_steps)


def step_tokens_pmf(params: WorkloadParams) -> np.ndarray:
    """P(L = l) for l = 2..max_step_tokens (an opener and the delimiter at least)."""
    return discrete_lognormal(params.step_tokens_median, params.step_tokens_sigma, 2, params.max_step_tokens)


def accuracy_for(params: WorkloadParams, base_slip: float) -> float:
    """One sample's accuracy when level l's steps each err with base_slip x its slip scale."""
    total = 0.0
    for level, scale in enumerate(level_slip_scale(params), start=1):
        sound = 1.0 - min(base_slip * scale, 1.0)
        pmf = steps_pmf(params, level)
        total += float(np.dot(pmf, sound ** np.arange(1, len(pmf) + 1)))
    return total / params.levels


def slip_rates(params: WorkloadParams) -> np.ndarray:
    """Per-level per-step slip rate, its base solved by bisection so that accuracy_for = accuracy."""
    low, high = 0.0, 1.0 / float(level_slip_scale(params).max())
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if accuracy_for(params, mid) > params.accuracy else (low, mid)
    return np.minimum(level_slip_scale(params) * (low + high) / 2, 1.0)


def wrong_answer_weights(params: WorkloadParams) -> np.ndarray:
    """Weights of a problem's 15 wrong answers, most popular first (Zipf)."""
    weights = 1.0 / np.arange(1, ANSWERS) ** params.wrong_answer_decay
    return weights / weights.sum()


# ---- presets ------------------------------------------------------------------------------------------------
REFERENCE_SOLUTIONS = ("reference solutions' statistics (median characters per step / 4 characters per token)"
                       " are a lower bound; generators following the '## Step N:' prompt write longer steps")
TRACE_NOTE = "assumption until fitted from a trace (specscale_lab.calibration.trace.fit_workload)"

DATASETS: dict[str, dict] = {
    "gsm8k": {
        "steps_median": 4.0, "steps_sigma": 0.35, "step_tokens_median": 40.0, "step_tokens_sigma": 0.162,
        "top_token_prob": 0.9869, "question_tokens_median": 55.0, "question_tokens_sigma": 0.4,
        "sources": {
            "steps_median": f"GSM8K reference solutions have a median of 3 reasoning lines (p90 6), plus the answer "
                            f"step; {TRACE_NOTE}",
            "step_tokens_median": f"GSM8K reasoning lines: median 72 characters; {REFERENCE_SOLUTIONS}; {TRACE_NOTE}",
            "step_tokens_sigma": "calibrate.waiting_sigma: median waiting at batch size 1 of 20% for beam search "
                                 "N = 8 (published: 20-55% for GSM8K < MATH < OlympiadBench with "
                                 "Qwen2.5-3B-Instruct + Qwen2.5-Math-PRM-7B)",
            "top_token_prob": "calibrate.top_token_prob: sibling common-prefix ratio 0.45 at M = 4, the easy end of "
                              "the published 25-50% at T = 0.8 (more sharing on easier data sets)",
            "question_tokens_median": "GSM8K questions: median 222 characters / 4 characters per token",
        }},
    "math500": {
        "steps_median": 6.0, "steps_sigma": 0.45, "step_tokens_median": 60.0, "step_tokens_sigma": 0.325,
        "top_token_prob": 0.9867, "question_tokens_median": 40.0, "question_tokens_sigma": 0.6,
        "sources": {
            "steps_median": f"assumption: MATH reference solutions are one paragraph for 349 of 500 problems, so they "
                            f"say little about model steps; {TRACE_NOTE}",
            "step_tokens_median": f"MATH-500 reference steps: median 208 characters (~52 tokens); {TRACE_NOTE}",
            "step_tokens_sigma": "calibrate.waiting_sigma: median waiting at batch size 1 of 35% for beam search N = 8 "
                                 "(between the published GSM8K 20% and OlympiadBench 55%)",
            "top_token_prob": "calibrate.top_token_prob: sibling common-prefix ratio 0.35 at M = 4 (middle of the "
                              "published 25-50% at T = 0.8)",
            "question_tokens_median": "MATH-500 problems: median 148 characters / 4 characters per token",
        }},
    "olympiadbench": {
        "steps_median": 9.0, "steps_sigma": 0.5, "step_tokens_median": 70.0, "step_tokens_sigma": 0.651,
        "top_token_prob": 0.9884, "question_tokens_median": 57.0, "question_tokens_sigma": 0.6,
        "sources": {
            "steps_median": f"OlympiadBench first solutions: median 5 steps (p90 17) split on blank lines; "
                            f"{TRACE_NOTE}",
            "step_tokens_median": f"OlympiadBench steps: median 110 characters (p90 402); {REFERENCE_SOLUTIONS}; "
                                  f"{TRACE_NOTE}",
            "step_tokens_sigma": "calibrate.waiting_sigma: median waiting at batch size 1 of 55% for beam search N = 8 "
                                 "(the published hard end)",
            "top_token_prob": "calibrate.top_token_prob: sibling common-prefix ratio 0.25 at M = 4 (the published "
                              "hard end of 25-50% at T = 0.8)",
            "question_tokens_median": "OlympiadBench questions: median 226 characters / 4 characters per token",
        }},
}

# One sample's accuracy per generator and data set. Sources: the Qwen2.5 release's instruct-model tables
# (MATH / GSM8K, zero-shot CoT) and Meta's Llama 3.1 / 3.2 model cards (MATH CoT, GSM8K CoT);
# OlympiadBench: assumption (about half the MATH accuracy), until fitted from a trace.
GENERATOR_ACCURACY: dict[str, dict[str, float]] = {
    "qwen2.5-3b-instruct": {"gsm8k": 0.867, "math500": 0.659, "olympiadbench": 0.30},
    "qwen2.5-7b-instruct": {"gsm8k": 0.916, "math500": 0.755, "olympiadbench": 0.38},
    "llama-3.2-3b-instruct": {"gsm8k": 0.777, "math500": 0.480, "olympiadbench": 0.20},
    "llama-3.1-8b-instruct": {"gsm8k": 0.845, "math500": 0.519, "olympiadbench": 0.22},
}

PRM_PRESETS: dict[str, tuple[PRMScoreParams, str]] = {
    "qwen2.5-math-prm-7b": (
        PRMScoreParams(perfect_share_sound=0.30, perfect_share_erred=0.03, auc=0.85, sound_logit_mean=2.5,
                       logit_spread=1.5, detection=0.7),
        "ordering from the published fact that Qwen2.5-Math-PRM gives exact 1.0 scores more often than "
        "Llama3.1-8B-PRM; detection about ProcessBench's average F1 for finding the first erroneous step (about "
        "0.7 for Qwen2.5-Math-PRM-7B, under 0.3 for the RLHFlow 8B PRMs, as reported with Qwen2.5-Math-PRM's "
        "release); the other magnitudes are assumptions until fitted from a trace",
    ),
    "llama3.1-8b-prm-deepseek-data": (
        PRMScoreParams(perfect_share_sound=0.05, perfect_share_erred=0.005, auc=0.72, sound_logit_mean=1.5,
                       logit_spread=1.5, detection=0.35),
        "see qwen2.5-math-prm-7b: fewer exact 1.0 scores, fewer errors noticed and a weaker separation; "
        "magnitudes are assumptions until fitted from a trace",
    ),
}

# The bundled toy models on the toy task (docs/toy-models.md, measured with their statistics script).
TOY = WorkloadParams(
    name="toy", accuracy=0.518, steps_median=5.0, steps_sigma=0.16, step_tokens_median=20.0,
    step_tokens_sigma=0.36, top_token_prob=0.952, question_tokens_median=30.0, question_tokens_sigma=0.25,
    system_prompt_tokens=20, levels=5, max_steps=40, max_step_tokens=256,
    prm=PRMScoreParams(perfect_share_sound=0.04, perfect_share_erred=0.002, auc=0.92, sound_logit_mean=1.5,
                       logit_spread=1.5),
    sources={
        "accuracy": "docs/toy-models.md: one sample 51.8%",
        "steps_median": "docs/toy-models.md: steps per solution median 5",
        "steps_sigma": "the spread of log steps per solution within a request, 0.16, from a best-of-n trace of the "
                       "toy models (benchmarks/sim_validation.py sibling_steps_sigma, 2026-12-04; the levels carry "
                       "the spread between problems: 0.26, from the p90 of 7 over all solutions, double-counted it)",
        "step_tokens_median": "docs/toy-models.md: tokens per step median 20, within-round CV 0.37",
        "top_token_prob": "calibrate.top_token_prob: the toy's common-prefix ratio 27.3% (docs/toy-models.md)",
        "step_tokens_sigma": "docs/toy-models.md: within-round CV 0.37; gives waiting 37.7% at N = 8 (measured: 39.3% "
                             "median, 37.3% mean)",
        "prm": "docs/toy-models.md: within-problem AUC 0.92, 2.1-3.8% exact 1.0 in bf16",
        "question_tokens_median": "assumption: a toy story of 1-8 events is about 30 tokens",
    },
)

SAL_SYSTEM_PROMPT_TOKENS = 170  # search-and-learn's generator system prompt (about 690 characters / 4)


def preset(dataset: str, generator: str, prm: str) -> WorkloadParams:
    """The workload of a data set (gsm8k, math500, olympiadbench), a generator and a PRM (bundled names)."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown data set {dataset!r}; known: {sorted(DATASETS)}")
    if generator not in GENERATOR_ACCURACY:
        raise ValueError(f"no accuracy for generator {generator!r}; known: {sorted(GENERATOR_ACCURACY)}")
    if prm not in PRM_PRESETS:
        raise ValueError(f"no score model for PRM {prm!r}; known: {sorted(PRM_PRESETS)}")
    shape = dict(DATASETS[dataset])
    sources = dict(shape.pop("sources"))
    prm_params, prm_source = PRM_PRESETS[prm]
    sources.update({
        "accuracy": "the Qwen2.5 release's instruct tables / Meta's model cards (zero-shot CoT); OlympiadBench: "
                    "assumption", "prm": prm_source,
        "system_prompt_tokens": "search-and-learn's generator system prompt, about 690 characters / 4",
        "levels": "assumption: five difficulty levels as in MATH, uniform",
    })
    return WorkloadParams(name=f"{dataset}/{generator}/{prm}", accuracy=GENERATOR_ACCURACY[generator][dataset],
                          system_prompt_tokens=SAL_SYSTEM_PROMPT_TOKENS, prm=prm_params, sources=sources, **shape)
