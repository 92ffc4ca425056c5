"""resolve_device_properties: the one resolver of a stack's `DeviceProperties`, which every stack kind calls
once, before it builds its engines (`pipeline.py` on checkpoints, `sim/simulation.py` on simulated models).

Each property has one rule, with what each kind knows as its inputs:

- the speculative row budget: `costmodel/row_budget.py` `resolve_row_budget` — the override (`--spare-rows`),
  else the budget measured on this machine (`specscale profile-decode`), else the budget on the device's cost
  model, else unbounded;
- the lazy-verification threshold: `verify/profile.py` `resolve_lv_threshold` — the override
  (`--lv-threshold`), else the PRM's knee profiled on this device, else its knee on the device's cost model
  (`costmodel/prm_knee.py`), else `DEFAULT_LV_THRESHOLD`.
"""

from __future__ import annotations

from collections.abc import Callable

from specscale.costmodel.cost import CostModel
from specscale.costmodel.model_profile import ModelProfile
from specscale.costmodel.prm_knee import cost_model_knee
from specscale.costmodel.row_budget import resolve_row_budget
from specscale.runtime.device_properties import DeviceProperties
from specscale.verify.profile import resolve_lv_threshold


def resolve_device_properties(cost_model: CostModel | None, generator: ModelProfile, prm: Callable[[], ModelProfile],
                              max_rows: int, lv_threshold_tokens: int | None, spare_rows: int | None,
                              profiled_lv: int | None = None, measured_rows: int | None = None) -> DeviceProperties:
    """lv_threshold_tokens / spare_rows: the overrides; prm: the PRM's shape, read only when its knee on the
    cost model is needed (no override, no profile); profiled_lv / measured_rows: what was measured on this
    machine, where the kind measures anything."""
    rows = resolve_row_budget(spare_rows, cost_model, generator, max_rows, measured_rows)
    known = lv_threshold_tokens is not None or profiled_lv is not None
    modelled = None if known or cost_model is None else cost_model_knee(cost_model, prm())
    return DeviceProperties(resolve_lv_threshold(lv_threshold_tokens, profiled_lv, modelled), rows)
