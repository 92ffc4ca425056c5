"""Named variants: each is a composition of policy switches on SearchConfig, so an ablation is a
configuration, not a fork of the code."""

from __future__ import annotations

from dataclasses import replace

from specscale.config import SearchConfig

_SPECULATIVE = {"speculative": True, "verification": "immediate"}
# FastTTS's headline runs (its artifact's `spec_prefix` configurations): beam search with children spread
# uniformly, plus Speculative Beam Extension (LookAhead). Its dynamic-branching approach is a separate
# configuration there, and a separate preset here (docs/design.md, "FastTTS").
_FASTTTS = {"lookahead": True}
_DYNAMIC_BRANCHING = {"dynamic_branching": True, "branching_score": "lookahead"}

PRESETS: dict[str, dict] = {
    "beam": {},
    "beam+cd": {"dedup": True},
    # the control with everything but speculation: beam+cd whose finished rounds go through specscale's lazy
    # queue and triggers (cross-request batched verification without speculation)
    "beam+cd+lv": {"dedup": True, "verification": "lazy_round"},
    "best-of-n": {"selection": "best_of_n", "max_rounds": 1},
    "dvts": {"selection": "dvts"},
    "naive-spec": dict(_SPECULATIVE),
    "fasttts": dict(_FASTTTS, verification="per_request"),
    "fasttts-xb": dict(_FASTTTS, verification="round"),
    "fasttts-db": dict(_FASTTTS, **_DYNAMIC_BRANCHING, verification="per_request"),
    "ep-strict": dict(_SPECULATIVE, prune_strict=True),
    "ep": dict(_SPECULATIVE, prune_strict=True, perfect_shortcut=True),
    "ep+cd": dict(_SPECULATIVE, prune_strict=True, perfect_shortcut=True, dedup=True),
    "specscale": dict(_SPECULATIVE, prune_strict=True, perfect_shortcut=True, dedup=True, verification="lazy"),
    "specscale-adaptive": dict(_SPECULATIVE, prune_strict=True, perfect_shortcut=True, dedup=True,
                               verification="lazy", lv_policy="adaptive"),
}


def preset_config(name: str, **overrides) -> SearchConfig:
    """The SearchConfig of a named preset, with any field overridden (e.g. beam_size=4)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return replace(SearchConfig(**PRESETS[name]), **overrides)
