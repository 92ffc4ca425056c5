"""The composition root: a `stack.py` `Stack` for any backend kind, built from one frozen description by
`build_stack`. Every caller — `specscale serve` and each Ray replica (`server/serving_process.py`), `solve`,
`bench`, `eval`, `simulate` and the benchmarks — builds its stack here.

A description names what to build and carries its kind's builder (`StackDescription.build`):

- `pipeline.py` `PipelineConfig`: our engine on real checkpoints, the PRM verifier in this process (`Pipeline`);
- `RemoteVerifierPipeline`: the same generator, its PRM served elsewhere by any `VerifierBackend`
  (`scaleout/remote_verifier.py`, docs/scale-out.md);
- `sim/simulation.py` `SimulationConfig`: the simulator (`Simulation`). The serving path never imports
  `specscale/sim/`, which is why a description carries its builder rather than this module naming them all.

A new backend is one more frozen description whose `build` composes its parts: vLLM's is
`vllm_backend/stack.py` `VllmPipelineConfig` (docs/design.md, "vLLM backend"). Every builder
resolves its `DeviceProperties` once, through `device_resolver.py`, before it builds an engine, and the
stack hands the value down (the row budget to the generator engine, the LV threshold to each runtime).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

from specscale.pipeline import Pipeline, PipelineConfig
from specscale.runtime.backend import VerifierBackend
from specscale.stack import Stack

StackT = TypeVar("StackT", bound=Stack, covariant=True)


class StackDescription(Protocol[StackT]):
    """A frozen description of one stack; build() composes it (each call a new stack, its models loaded)."""

    def build(self) -> StackT: ...


@dataclass(frozen=True)
class RemoteVerifierPipeline:
    """pipeline: the generator's (and the PRM's shape and format, for the device properties and the server);
    verifier: the PRM served elsewhere, which must also carry the PRM's `format` and `max_input_tokens`."""

    pipeline: PipelineConfig
    verifier: VerifierBackend

    def build(self) -> Pipeline:
        return Pipeline(self.pipeline, verifier=self.verifier)


def build_stack(description: StackDescription[StackT]) -> StackT:
    """The stack a description names: its device properties resolved once, its engines and verifier built."""
    return description.build()
