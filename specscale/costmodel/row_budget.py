"""The speculative row budget: how many rows a generator iteration may hold before one more row stops being
nearly free on this device (docs/design.md, "Speculation"). A device property, resolved in this one place
(`resolve_row_budget`) from the device's cost model, for the real stack (`pipeline.py`) and the simulated one
(`sim/simulation.py`) alike; `--spare-rows` overrides it.

An iteration of R decode rows costs t(R) seconds (the cost model's, at a typical context). Speculative rows
are admitted while a row's marginal cost is under half the mean cost of a row:

    budget = the smallest R with  t(R + 1) - t(R) >= t(R) / (2 R)      (capped at max_rows)

On a roofline (a GPU decode reading its weights once per iteration) the marginal cost is about zero until
the decode turns compute-bound, then a whole row's FLOPs: the budget is the compute knee. On a CPU fit
t(R) = fixed + R x per_row it is R = fixed / per_row: speculation rides in the room the fixed cost leaves.
"""

from __future__ import annotations

import logging

from specscale.costmodel.cost import CostModel, IterationWork, RooflineCostModel
from specscale.costmodel.hardware import HardwareProfile
from specscale.costmodel.model_profile import ModelProfile

logger = logging.getLogger(__name__)

TYPICAL_CONTEXT_TOKENS = 256  # a decode row's context: system prompt, question and a few steps (KV read per row)
CUDA_PROFILES = {"a100": "a100-80gb", "h100": "h100-80gb", "h200": "h200"}  # device name fragment -> profile


def speculative_row_budget(cost_model: CostModel, model: ModelProfile, max_rows: int,
                           context_tokens: int = TYPICAL_CONTEXT_TOKENS) -> int:
    """The module docstring's budget for `model`'s decode on the cost model's device."""
    def seconds(rows: int) -> float:
        work = IterationWork(decode_contexts=(context_tokens,) * rows, head_rows=rows, live_sequences=rows)
        return cost_model.iteration_seconds(model, work, "generator")

    cost = seconds(1)
    for rows in range(1, max_rows):
        following = seconds(rows + 1)
        if following - cost >= cost / (2 * rows):
            return rows
        cost = following
    return max_rows


def hardware_profile_for(device: str, device_name: str | None = None) -> HardwareProfile | None:
    """The bundled profile of the device a real engine runs on: `cpu` for the CPU, the GPU's by its name
    (torch.cuda.get_device_name), None for a device without one."""
    if device == "cpu":
        return HardwareProfile.load("cpu")
    name = (device_name or "").lower()
    for fragment, profile in CUDA_PROFILES.items():
        if fragment in name:
            return HardwareProfile.load(profile)
    return None


def resolve_row_budget(override: int | None, cost_model: CostModel | None, generator: ModelProfile,
                       max_rows: int, measured: int | None = None) -> int | None:
    """The speculative row budget a stack hands its generator engine: the override (`--spare-rows`), else
    the budget measured for this generator on this machine (`specscale profile-decode`,
    engine/decode_profile.py), else the budget of `generator` on the cost model's device; None (unbounded) on
    a device with neither. The one rule of this property, for real checkpoints and simulated models alike
    (device_resolver.py)."""
    if override is not None:
        return override
    if measured is not None:
        return min(measured, max_rows)
    if cost_model is None:
        logger.warning("no cost profile for this device: speculative rows may fill the batch")
        return None
    return speculative_row_budget(cost_model, generator, max_rows)


def device_cost_model(device: str, device_name: str | None = None) -> CostModel | None:
    """The roofline cost model of the device a real engine runs on (`hardware_profile_for`), None without one."""
    hardware = hardware_profile_for(device, device_name)
    return None if hardware is None else RooflineCostModel(hardware)
