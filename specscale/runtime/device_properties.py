"""DeviceProperties: what a stack resolved for its device, once, before it built anything, and hands down as
a value — the speculative row budget to its generator engine's scheduler, the lazy-verification threshold to
every runtime it builds (each request's flush policy, `runtime/lazy_flush.py`).

Resolved by `device_resolver.py` `resolve_device_properties`, which every stack kind calls (docs/architecture.md);
the runtime takes the value and resolves nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceProperties:
    """lv_threshold_tokens: the PRM tokens a lazy-verification batch waits for (the PRM's knee on this device);
    spare_rows: speculative rows fill an iteration up to this many, None unbounded (no cost model)."""

    lv_threshold_tokens: int
    spare_rows: int | None
