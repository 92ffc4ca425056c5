"""Named variants: each is a composition of the policies SearchConfig names (selection, verification,
speculation, pruning, ...) and their switches, so an ablation is a configuration, not a fork of the code; a new
variant is a policy class (registered under its name, `search/registry.py`) and one line here. A variant may
also be written `preset[field=value,...]`: the preset with those SearchConfig fields changed
(`specscale[lv_sibling_trigger=false]`), so an ablation the presets do not name needs no code either."""

from __future__ import annotations

import re
from dataclasses import replace

from specscale.config import SearchConfig
from specscale.search.policy_set import build_policies

_SPECULATIVE = {"speculation": "eager", "verification": "immediate"}
# FastTTS's headline runs (its artifact's `spec_prefix` configurations): beam search with children spread
# uniformly, plus Speculative Beam Extension (LookAhead). Its dynamic-branching approach is a separate
# configuration there, and a separate preset here (docs/design.md, "FastTTS").
_FASTTTS = {"lookahead": True}
_DYNAMIC_BRANCHING = {"dynamic_branching": True, "branching_score": "lookahead"}

PRESETS: dict[str, dict] = {
    "beam": {},
    # search-and-learn's batched loop: the requests in flight advance round by round together (each generates
    # its round, then all are scored in one call), admitted in waves of max_concurrency (docs/design.md)
    "beam-sync": {"verification": "lock_step"},
    "beam+cd": {"dedup": True},
    # beam+cd whose finished steps go through specscale's lazy queue and triggers: lazy verification without
    # speculation, cross-request batched verification (docs/design.md, "Verification")
    "beam+cd+lv": {"dedup": True, "verification": "lazy"},
    "best-of-n": {"selection": "best_of_n", "max_rounds": 1},
    "dvts": {"selection": "dvts"},
    "naive-spec": dict(_SPECULATIVE),
    # the paper's naive speculation: speculative rows admitted like any other row (no row budget, no ranking)
    "naive-spec-unbounded": dict(_SPECULATIVE, speculation="eager_unbounded"),
    "fasttts": dict(_FASTTTS, verification="per_request"),
    "fasttts-xb": dict(_FASTTTS, verification="round"),
    "fasttts-db": dict(_FASTTTS, **_DYNAMIC_BRANCHING, verification="per_request"),
    "ep-strict": dict(_SPECULATIVE, pruning="strict"),
    # ep-strict that also prunes ties with the k-th best, by selection's tie order: still beam's retention
    "ep-strict+ties": dict(_SPECULATIVE, pruning="strict_ties"),
    "ep": dict(_SPECULATIVE, pruning="strict", perfect_shortcut=True),
    "ep+cd": dict(_SPECULATIVE, pruning="strict", perfect_shortcut=True, dedup=True),
    "specscale": dict(_SPECULATIVE, pruning="strict", perfect_shortcut=True, dedup=True, verification="lazy"),
    # the control with everything but speculation: specscale's switches with speculation off (EP's strict
    # threshold and perfect-score shortcut act on the round being decided, CD, lazy verification)
    "specscale-nospec": dict(pruning="strict", perfect_shortcut=True, dedup=True, verification="lazy"),
    "specscale-adaptive": dict(_SPECULATIVE, pruning="strict", perfect_shortcut=True, dedup=True,
                               verification="lazy", lv_policy="adaptive"),
    # early exit (docs/design.md, "Early exit"): beam and specscale that stop once the best completed path can no
    # longer be overtaken (exact: the same answer), or at a certainty threshold, or when the search stalls
    "beam+exit": {"early_exit": "exact"},
    "specscale+exit": dict(_SPECULATIVE, pruning="strict", perfect_shortcut=True, dedup=True, verification="lazy",
                           early_exit="exact"),
    "specscale+exit-soft": dict(_SPECULATIVE, pruning="strict", perfect_shortcut=True, dedup=True,
                                verification="lazy", early_exit="certain"),
    "specscale+exit-stall": dict(_SPECULATIVE, pruning="strict", perfect_shortcut=True, dedup=True,
                                 verification="lazy", early_exit="exact+stall"),
    # partial-step rejection (docs/design.md, "Partial-step rejection"): a running step scored at partial_tokens
    # tokens is stopped when clearly below its round's k-th best (not exact)
    "specscale+reject": dict(_SPECULATIVE, pruning="strict", perfect_shortcut=True, dedup=True, verification="lazy",
                             partial_rejection="kth"),
    # KV-aware retention (docs/design.md, "KV-aware retention"; ETS): among copies within retention_margin of a
    # round's k-th best score, a new written answer first, then the fewest tokens of KV added (not exact)
    "beam+kv": {"retention": "kv"},
    "specscale+kv": dict(_SPECULATIVE, pruning="strict", perfect_shortcut=True, dedup=True, verification="lazy",
                         retention="kv"),
}


def preset_config(variant: str, **overrides) -> SearchConfig:
    """The SearchConfig of a variant (a preset name, or `preset[field=value,...]`), with any field
    overridden (e.g. beam_size=4)."""
    name, fields = parse_variant(variant)
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    unknown = sorted(set(fields) - set(SearchConfig.__dataclass_fields__))
    if unknown:
        raise ValueError(f"variant {variant!r}: SearchConfig has no field(s) {unknown}")
    config = replace(SearchConfig(**PRESETS[name]), **fields, **overrides)
    build_policies(config)  # an unknown policy name: a ValueError here, not at submit
    return config


def parse_variant(variant: str) -> tuple[str, dict]:
    """`preset[field=value,...]` -> (preset, {field: value}); values are true / false / none, integers,
    floats or text. A plain preset name has no fields."""
    name, bracket, rest = variant.strip().partition("[")
    if not bracket:
        return name, {}
    if not rest.endswith("]"):
        raise ValueError(f"variant {variant!r}: expected preset[field=value,...]")
    fields = {}
    for item in filter(None, (part.strip() for part in rest[:-1].split(","))):
        field, equals, value = item.partition("=")
        if not equals or not field.strip():
            raise ValueError(f"variant {variant!r}: {item!r} is not field=value")
        fields[field.strip()] = _value(value.strip())
    return name.strip(), fields


_INTEGER = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")
_WORDS = {"true": True, "false": False, "none": None}


def _value(text: str):
    if text.lower() in _WORDS:
        return _WORDS[text.lower()]
    if _INTEGER.fullmatch(text):
        return int(text)
    return float(text) if _FLOAT.fullmatch(text) else text


def split_variants(text: str) -> list[str]:
    """A comma-separated list of variants, commas inside a variant's brackets kept:
    "beam,specscale[lv_max_deferrals=3,lv_sibling_trigger=false]" -> two variants."""
    variants, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            variants.append(text[start:i])
            start = i + 1
    variants.append(text[start:])
    return [v.strip() for v in variants if v.strip()]
