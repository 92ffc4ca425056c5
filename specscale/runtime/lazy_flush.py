"""Lazy-verification flush policies: which trigger a request's queued lazy steps raise (docs/design.md,
"Verification"). `SearchConfig.lv_policy` names one per request: each class registers under its name in
`LAZY_FLUSH` (`search/registry.py`, the registry every policy kind uses). The runtime builds it
(`flush_policy`) at the verifier's threshold, and the verify queue asks it, every tick, which trigger holds. Any trigger flushes the verifier's whole lazy queue, every queued step of every request in one PRM
call (the paper's lazy verification; `runtime/verify_queue.py`); `SearchConfig.lv_flush_scope = "request"`
flushes the triggering request's steps only (an ablation, in no preset).

- `FixedTriggers` ("fixed", the paper's lazy verification): the lazy PRM tokens queued by all requests reach
  the verifier's threshold; one of the request's steps completed its sibling group; one was deferred more
  than `max_deferrals` ticks; one is older than `max_age_s`.
- `AdaptiveBudget` ("adaptive", beyond the paper): keeps the sibling-group trigger, and otherwise weighs what
  waiting longer costs against what it can still gain. Each cost is a share of its budget:

      wait  = age of the request's oldest queued step / (wait_budget_calls x the mean PRM call so far)
      spec  = tokens the request's live speculative sequences hold / speculative_budget_tokens
      kv    = max(0, generator KV in use - KV_FLOOR) / (kv_budget - KV_FLOOR)        (shares of the pool)

  and the gain left is the batch's missing fill, 1 - min(queued lazy tokens / threshold, 1). The request
  flushes when wait + spec + kv >= that gain: a full batch at once (as the token trigger), an empty one once
  the pressures add up to a whole budget. Waiting is measured in PRM calls, the cost lazy verification
  amortises, so the budget scales with the device instead of counting ticks. And whenever the PRM runs
  anyway (eager steps, another request's trigger), its queued steps ride along (`rides_along`): that call's
  fixed cost is paid already, and waiting for a later one would only add another.

`SearchConfig.lv_ride_along` switches riding along on or off for either policy (an ablation); with the whole
queue flushed (the default scope) every policy rides along unless it is switched off.
`SearchConfig.lv_sibling_trigger = False` drops the sibling-group trigger from either policy (an ablation, in
no preset: docs/BENCHMARKS.md measures what the trigger costs).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from specscale.config import SearchConfig
from specscale.search.registry import Registry

KV_FLOOR = 0.5  # below half the generator's KV pool in use, KV pressure costs nothing


@dataclass(frozen=True)
class FlushSignals:
    """What the runtime reports at one tick: the generator's KV pool in use (a share), the mean seconds of a
    PRM call so far (None before the first), tokens held by each request's live speculative sequences."""

    kv_used_share: float = 0.0
    prm_call_s: float | None = None
    speculative_tokens: dict[int, int] | None = None  # id(request state) -> tokens

    def speculative_tokens_of(self, request: object) -> int:
        return (self.speculative_tokens or {}).get(id(request), 0)


class LazyFlushPolicy(ABC):
    """One request's lazy-verification trigger. queued_tokens: lazy PRM tokens queued by all requests;
    signals() builds the tick's `FlushSignals` (only a policy that needs them calls it)."""

    # whether its steps ride along by default when a trigger flushes only the request's own steps
    rides_along_alone: ClassVar[bool]
    threshold_tokens: int
    rides_along: bool  # this policy's queued steps join any PRM batch that runs anyway
    whole_queue: bool  # its trigger flushes every queued lazy step of every request (False: the request's own)
    sibling_group: bool  # a queued step that completes its sibling group flushes (docs/design.md, "Verification")

    @classmethod
    @abstractmethod
    def configured(cls, config: SearchConfig, threshold_tokens: int) -> LazyFlushPolicy:
        """The policy with config's settings, at the verifier's token threshold."""

    @classmethod
    def scope(cls, config: SearchConfig) -> tuple[bool, bool, bool]:
        """(rides_along, whole_queue, sibling_group) as config sets them. Flushing the whole queue, every policy
        rides along unless the config switches it off; flushing the request's own steps, as `rides_along_alone`."""
        whole_queue = config.lv_flush_scope == "queue"
        default_ride = whole_queue or cls.rides_along_alone
        rides_along = default_ride if config.lv_ride_along is None else config.lv_ride_along
        return rides_along, whole_queue, config.lv_sibling_trigger

    def group_completed(self, items: Sequence) -> bool:
        """The sibling-group trigger: one of these queued steps completed its sibling group."""
        return self.sibling_group and any(i.completes_group for i in items)

    @abstractmethod
    def trigger(self, items: Sequence, queued_tokens: int, now: float,
                signals: Callable[[], FlushSignals]) -> str | None:
        """The name of the trigger that holds for this request's queued steps `items`, or None."""


LAZY_FLUSH: Registry[LazyFlushPolicy] = Registry("lv_policy")


@LAZY_FLUSH.register("fixed")
@dataclass(frozen=True)
class FixedTriggers(LazyFlushPolicy):
    rides_along_alone: ClassVar[bool] = False
    threshold_tokens: int
    max_deferrals: int
    max_age_s: float
    rides_along: bool = True
    whole_queue: bool = True
    sibling_group: bool = True

    @classmethod
    def configured(cls, config: SearchConfig, threshold_tokens: int) -> FixedTriggers:
        return cls(threshold_tokens, config.lv_max_deferrals, config.lv_max_age_s, *cls.scope(config))

    def trigger(self, items, queued_tokens, now, signals) -> str | None:
        if queued_tokens >= self.threshold_tokens:
            return "tokens"
        if self.group_completed(items):
            return "sibling-group"
        if any(i.deferrals > self.max_deferrals for i in items):
            return "deferrals"
        if any(now - i.enqueued_at > self.max_age_s for i in items):
            return "age"
        return None


@LAZY_FLUSH.register("adaptive")
@dataclass(frozen=True)
class AdaptiveBudget(LazyFlushPolicy):
    rides_along_alone: ClassVar[bool] = True
    threshold_tokens: int
    wait_budget_calls: float
    speculative_budget_tokens: float
    kv_budget: float
    rides_along: bool = True
    whole_queue: bool = True
    sibling_group: bool = True

    @classmethod
    def configured(cls, config: SearchConfig, threshold_tokens: int) -> AdaptiveBudget:
        return cls(threshold_tokens, config.lv_wait_budget_calls, config.lv_speculative_budget_tokens,
                   config.lv_kv_budget, *cls.scope(config))

    def trigger(self, items, queued_tokens, now, signals) -> str | None:
        if self.group_completed(items):
            return "sibling-group"
        gain_left = 1.0 - min(queued_tokens / self.threshold_tokens, 1.0)
        if gain_left <= 0.0:
            return "tokens"
        return "budget" if self.pressure(items, now, signals()) >= gain_left else None

    def pressure(self, items, now: float, signals: FlushSignals) -> float:
        """wait + spec + kv of the module docstring, for one request's queued steps."""
        age = now - min(i.enqueued_at for i in items)
        wait = age / (self.wait_budget_calls * signals.prm_call_s) if signals.prm_call_s else 0.0
        spec = signals.speculative_tokens_of(items[0].request) / self.speculative_budget_tokens
        kv = max(signals.kv_used_share - KV_FLOOR, 0.0) / (self.kv_budget - KV_FLOOR)
        return wait + spec + kv


def flush_policy(config: SearchConfig, threshold_tokens: int) -> LazyFlushPolicy:
    """The policy a request's config names, at the verifier's threshold (the runtime's: a request cannot set
    it); a ValueError naming `lv_policy` and the valid names if none is registered under it."""
    return LAZY_FLUSH.chosen(config).configured(config, threshold_tokens)


LV_POLICIES = LAZY_FLUSH.names()  # the names `SearchConfig.lv_policy` may take
