"""Helpers for engine tests: run to idle with block invariants checked after every iteration."""

from collections.abc import Iterator

from specscale.config import EngineConfig
from specscale.engine.engine import Engine
from specscale.pipeline import Pipeline, PipelineConfig


def make_engine(path, **overrides) -> Engine:
    options = dict(model=str(path), dtype="float32", num_kv_blocks=256, block_size=4, max_num_batched_tokens=256)
    options.update(overrides)
    return Engine(EngineConfig(**options))


def check_blocks(engine: Engine) -> None:
    engine.block_manager.check_invariants(engine.scheduler.sequences.values())


def run_until_idle(engine: Engine, max_steps: int = 10_000) -> dict[int, list]:
    """Step until no sequence has work; returns every output per sequence id, in order."""
    outputs: dict[int, list] = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return outputs
        for out in engine.step():
            outputs.setdefault(out.seq_id, []).append(out)
        check_blocks(engine)
    raise AssertionError("engine did not go idle")


def generated(outputs: dict[int, list], seq_id: int) -> list[int]:
    return [t for out in outputs.get(seq_id, []) for t in out.new_token_ids]


class ScriptedSampler:
    """Returns scripted tokens (one per draw) instead of sampling: exact control of what is generated."""

    def __init__(self, script: list[int]):
        self.script = list(script)

    def __call__(self, logits, rows):
        return [[self.script.pop(0) for _ in range(row.num_draws)] for row in rows]


def serving_pipeline(config: PipelineConfig) -> Iterator[Pipeline]:
    """A pipeline for a fixture (``yield from``): afterwards the PRM's cached step prefixes are dropped,
    the PRM engine must hold no KV block, and the pipeline is closed."""
    pipe = Pipeline(config)
    yield pipe
    pipe.verifier.clear()
    assert pipe.verifier.engine.block_manager.num_used_blocks == 0
    pipe.close()
