"""Per-run metrics of a SearchRuntime: where time went, how the verifier was batched, how many
physical sequences stood for how many logical candidates, what cancelled paths cost, peak KV."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class RunMetrics:
    generation_s: float = 0.0
    verification_s: float = 0.0
    generation_ticks: int = 0
    verifier_batch_items: list[int] = field(default_factory=list)
    verifier_batch_tokens: list[int] = field(default_factory=list)
    verifier_batch_requests: list[int] = field(default_factory=list)  # distinct requests per PRM call
    physical_sequences: list[int] = field(default_factory=list)  # per generator tick
    logical_candidates: list[int] = field(default_factory=list)  # per generator tick
    cancelled_tokens: list[int] = field(default_factory=list)  # per cancelled sequence
    cancelled_lifetimes_s: list[float] = field(default_factory=list)
    peak_kv_blocks: int = 0
    waiting_idle_s: float = 0.0  # candidates finished and waiting for their round to be decided
    waiting_busy_s: float = 0.0  # candidates generating their step

    def sample_blocks(self, used: int) -> None:
        self.peak_kv_blocks = max(self.peak_kv_blocks, used)

    def sample_sequences(self, multiplicities: list[int]) -> None:
        self.generation_ticks += 1
        self.physical_sequences.append(len(multiplicities))
        self.logical_candidates.append(sum(multiplicities))

    def verifier_call(self, items: int, tokens: int, requests: int) -> None:
        self.verifier_batch_items.append(items)
        self.verifier_batch_tokens.append(tokens)
        self.verifier_batch_requests.append(requests)

    def cancelled(self, tokens: int, lifetime_s: float) -> None:
        self.cancelled_tokens.append(tokens)
        self.cancelled_lifetimes_s.append(lifetime_s)

    def add_waiting(self, rounds: list[tuple[float, float]]) -> None:
        for idle, busy in rounds:
            self.waiting_idle_s += idle
            self.waiting_busy_s += busy

    def summary(self) -> dict:
        physical, logical = sum(self.physical_sequences), sum(self.logical_candidates)
        waited = self.waiting_idle_s + self.waiting_busy_s
        return {
            "generation_s": self.generation_s,
            "verification_s": self.verification_s,
            "generation_ticks": self.generation_ticks,
            "verifier_calls": len(self.verifier_batch_items),
            "verifier_batch_items_median": _median(self.verifier_batch_items),
            "verifier_batch_tokens_median": _median(self.verifier_batch_tokens),
            "verifier_batch_requests_mean": _mean(self.verifier_batch_requests),
            "physical_to_logical": physical / logical if logical else 1.0,
            "cancelled_sequences": len(self.cancelled_tokens),
            "cancelled_tokens": sum(self.cancelled_tokens),
            "cancelled_lifetime_median_s": _median(self.cancelled_lifetimes_s),
            "peak_kv_blocks": self.peak_kv_blocks,
            "waiting_time_ratio": self.waiting_idle_s / waited if waited else 0.0,
        }


def _mean(values) -> float:
    return float(statistics.fmean(values)) if values else 0.0


def _median(values) -> float:
    return float(statistics.median(values)) if values else 0.0
