"""The PRM's knee on a cost model: the lazy-verification threshold `specscale profile-prm` would measure on
the device the cost model describes (verify/profile.py measures it on a real engine; docs/design.md,
"Verification"). The simulated stack's threshold, and the real stack's where this PRM was never profiled on
this device: one derivation from the device's cost model for both (device_resolver.py).
"""

from __future__ import annotations

from specscale.costmodel.cost import CostModel, IterationWork
from specscale.costmodel.model_profile import ModelProfile
from specscale.verify.profile import DEFAULT_BATCH_TOKENS, ProfilePoint, knee, sequence_sizes

PROFILE_CONTEXT_TOKENS, PROFILE_STEP_TOKENS = 512, 128  # the shape `specscale profile-prm` measures


def cost_model_knee(cost_model: CostModel, prm: ModelProfile) -> int:
    """The knee of `prm`'s tokens/s against batch tokens on the cost model, for the batches profile-prm runs."""
    points = []
    for batch in DEFAULT_BATCH_TOKENS:
        sizes = sequence_sizes(batch, PROFILE_STEP_TOKENS)
        work = IterationWork((), tuple((n, PROFILE_CONTEXT_TOKENS) for n in sizes), len(sizes))
        points.append(ProfilePoint(batch, (cost_model.iteration_seconds(prm, work, "prm"),)))
    return knee(points)
