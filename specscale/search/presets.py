"""Named variants: each is a composition of policy switches on SearchConfig, so an ablation is a
configuration, not a fork of the code."""

from __future__ import annotations

from dataclasses import replace

from specscale.config import SearchConfig

_SPECULATIVE = {"speculative": True, "verification": "immediate"}
_FASTTTS = {"lookahead": True, "dynamic_branching": True, "branching_score": "lookahead"}

PRESETS: dict[str, dict] = {
    "beam": {},
    "beam+cd": {"dedup": True},
    "best-of-n": {"selection": "best_of_n", "max_rounds": 1},
    "dvts": {"selection": "dvts"},
    "naive-spec": dict(_SPECULATIVE),
    "fasttts": dict(_FASTTTS, verification="per_request"),
    "fasttts-xb": dict(_FASTTTS, verification="round"),
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
