"""Summing Prometheus text expositions: the cluster's /metrics is the sum, sample by sample, of every
replica's (and the ingress's) `ServerMetrics.render` output. Every SpecScale series is additive —
counters, histogram buckets / sums / counts, and gauges of running, waiting, KV blocks, tokens/s and
healthy engines — so the sum over the same name and labels is the cluster's value. Samples stay grouped
under their family's HELP / TYPE lines, families in first-seen order."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Family:
    comments: list[str] = field(default_factory=list)
    samples: dict[str, float] = field(default_factory=dict)  # "name{labels}" -> summed value


def sum_expositions(texts: list[str]) -> str:
    families: dict[str, _Family] = {}
    for text in texts:
        current = None
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                current = families.setdefault(line.split()[2], _Family())
                if line not in current.comments:
                    current.comments.append(line)
            elif line.strip() and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                family = current if current is not None else families.setdefault(key, _Family())
                family.samples[key] = family.samples.get(key, 0.0) + float(value)
    lines = []
    for family in families.values():
        lines += family.comments
        lines += [f"{key} {_number(value)}" for key, value in family.samples.items()]
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def only_families(text: str, names: set[str]) -> str:
    """The lines of `text` that belong to the named families (HELP, TYPE and samples)."""
    kept, keep = [], False
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            keep = line.split()[2] in names
        if keep:
            kept.append(line)
    return "\n".join(kept) + "\n"
