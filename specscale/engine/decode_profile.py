"""The generator's decode cost curve on this machine, and the speculative row budget it implies.

Speculative rows are worth running while one more decode row is nearly free (docs/design.md, "Speculation").
The simulator reads that from a device's cost model (`costmodel/row_budget.py`); a real engine can measure it, and
should: a CPU's fixed cost per iteration against its cost per row changes from one CPU to the next (the bundled
`cpu` profile was fitted on one machine). So, once per generator, device and machine:

- one cached context of `context_tokens` (a question and a few steps) is forked into R rows, each decoding
  `steps` tokens; the mean seconds per iteration after the first is t(R), for R in `rows`;
- every R is run once to warm up, then `repeats` times, the sizes interleaved round by round (a slow spell on
  a shared machine hits every size alike), and summarised by the median;
- the budget applies `costmodel/row_budget.py`'s rule to the measured curve, linearly interpolated: the smallest R
  at which the marginal cost of a row reaches half the mean cost of a row, t'(R) >= t(R) / (2 R). On a CPU
  (t = fixed + R x per_row) that is R = fixed / per_row; on a GPU it is the decode's compute knee.

`specscale profile-decode` measures and writes `~/.cache/specscale/decode-profiles/<model>-<machine>.json`;
`load_row_budget` reads it, and `costmodel/row_budget.py`'s resolver prefers it to the bundled cost model.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specscale.config import EngineConfig
from specscale.engine.engine import Engine
from specscale.model.machine import MachineFingerprint
from specscale.seam.sampling import SamplingParams

DEFAULT_ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
TYPICAL_CONTEXT_TOKENS = 256  # as costmodel/row_budget.py: a system prompt, a question and a few steps
BLOCK_SIZE = 16


@dataclass(frozen=True)
class DecodeProfileConfig:
    """What to measure: the generator, the row counts, how often, and one row's context."""

    model: str
    rows: tuple[int, ...] = DEFAULT_ROWS
    repeats: int = 3
    steps: int = 8  # decode iterations per timing (the first, which may allocate, is not counted)
    context_tokens: int = TYPICAL_CONTEXT_TOKENS
    dtype: str = "auto"
    device: str = "cpu"
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.rows or min(self.rows) < 1 or len(set(self.rows)) < 2:
            raise ValueError(f"rows must hold at least two distinct positive counts, got {self.rows}")
        if self.repeats < 1 or self.steps < 2 or self.context_tokens < 1:
            raise ValueError("repeats >= 1, steps >= 2 and context_tokens >= 1 are required")


@dataclass(frozen=True)
class DecodeProfile:
    """A measured curve (rows -> median seconds per iteration) and the budget read off it."""

    model: str
    device: str
    machine: str  # MachineFingerprint.describe() while measuring
    dtype: str
    context_tokens: int
    rows: tuple[int, ...]
    seconds: tuple[float, ...]  # median seconds per iteration at each row count
    budget: int

    def to_json(self) -> dict:
        return asdict(self)


def row_budget_from_curve(rows: tuple[int, ...], seconds: tuple[float, ...], max_rows: int) -> int:
    """The smallest R with t'(R) >= t(R) / (2 R) on the curve through the points (linear between them;
    past the last point, its last segment's slope), capped at max_rows."""
    points = sorted(zip(rows, seconds, strict=True))
    for (r0, t0), (r1, t1) in zip(points, points[1:], strict=False):
        slope = (t1 - t0) / (r1 - r0)  # the marginal cost of a row between r0 and r1
        for r in range(r0, r1):
            if r >= max_rows:
                return max_rows
            if slope >= (t0 + slope * (r - r0)) / (2 * r):
                return r
    (r0, t0), (r1, t1) = points[-2], points[-1]
    slope = (t1 - t0) / (r1 - r0)
    if slope <= 0:
        return max_rows
    fixed = t1 - slope * r1  # the last segment's line t = fixed + slope x R meets the rule at R = fixed / slope
    return max(points[-1][0], min(max_rows, int(fixed / slope)))


def profile_decode(config: DecodeProfileConfig, max_rows: int = 512, progress=None) -> DecodeProfile:
    """Measure t(R) for every R of the config and read the budget off the curve."""
    engine = _profiling_engine(config)
    generator = torch.Generator().manual_seed(config.seed)
    vocab = engine.runner.vocab_size
    context = engine.add(torch.randint(0, vocab, (config.context_tokens,), generator=generator).tolist(), None,
                         readout_positions=[config.context_tokens - 1])
    _drain(engine)
    timings: dict[int, list[float]] = {r: [] for r in sorted(config.rows)}
    for repeat in range(config.repeats + 1):  # round 0 warms every size up
        for r, times in timings.items():
            elapsed = _time_rows(engine, context, r, config, generator)
            if repeat:
                times.append(elapsed)
        if repeat and progress is not None:
            progress(f"repeat {repeat}/{config.repeats}: " + ", ".join(
                f"{r}: {times[-1] * 1e3:.2f} ms" for r, times in timings.items()))
    engine.abort(context)
    rows = tuple(timings)
    seconds = tuple(statistics.median(times) for times in timings.values())
    return DecodeProfile(str(Path(config.model).expanduser().resolve()), device_label(config.device),
                         MachineFingerprint.current().describe(), str(engine.runner_dtype).removeprefix("torch."),
                         config.context_tokens, rows, seconds, row_budget_from_curve(rows, seconds, max_rows))


def _profiling_engine(config: DecodeProfileConfig) -> Engine:
    """A generator engine with KV for the context and every row's decoded tokens (no prefix cache)."""
    most = max(config.rows)
    blocks_per_row = -(-config.steps // BLOCK_SIZE) + 1  # + the copy-on-write block of the shared tail
    engine = Engine(EngineConfig(
        model=str(config.model), dtype=config.dtype, device=config.device, block_size=BLOCK_SIZE,
        num_kv_blocks=-(-config.context_tokens // BLOCK_SIZE) + most * blocks_per_row + 8,
        max_num_seqs=most + 1, enable_prefix_caching=False, seed=config.seed,
    ))
    if config.context_tokens + config.steps + 1 > engine.max_model_len:
        raise ValueError(f"context_tokens + steps = {config.context_tokens + config.steps} exceeds the "
                         f"generator's context of {engine.max_model_len}")
    return engine


def _time_rows(engine: Engine, context: int, rows: int, config: DecodeProfileConfig, generator) -> float:
    """Mean seconds per decode iteration of `rows` rows forked from the context."""
    vocab = engine.runner.vocab_size
    params = SamplingParams(temperature=0.8, max_new_tokens=config.steps, ignore_eos=True)
    children = engine.fork(context, rows)
    for child in children:
        engine.extend(child, params, token_ids=torch.randint(0, vocab, (1,), generator=generator).tolist())
    engine.step()  # the one-token prefill of every row, and the first allocation
    _synchronize(engine)
    start = time.perf_counter()
    for _ in range(config.steps - 1):
        engine.step()
    _synchronize(engine)
    elapsed = (time.perf_counter() - start) / (config.steps - 1)
    for child in children:
        engine.abort(child)
    _drain(engine)
    return elapsed


def _drain(engine: Engine) -> None:
    while engine.has_work():
        engine.step()


def _synchronize(engine: Engine) -> None:
    if engine.config.device.startswith("cuda"):
        torch.cuda.synchronize()


# ---- the cached file -------------------------------------------------------------------------------
def default_profile_path(model: str | Path, device: str) -> Path:
    """~/.cache/specscale/decode-profiles/<model>-<device>-<hash>.json, the hash over the model folder, the
    device and (on a CPU) this machine's fingerprint: CPU model, ISA flags, threads, torch version."""
    model_path = str(Path(model).expanduser().resolve())
    label = device_label(device)
    machine = MachineFingerprint.current().key if label == "cpu" else ""
    digest = hashlib.sha1(f"{model_path}|{label}|{machine}".encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", f"{Path(model_path).name}-{label}").strip("-")
    return profile_dir() / f"{slug}-{digest}.json"


def profile_dir() -> Path:
    """$SPECSCALE_DECODE_PROFILE_DIR, else decode-profiles/ in the cache folder ($SPECSCALE_CACHE_DIR, the PRM
    profiles' too: verify/profile.py)."""
    folder = os.environ.get("SPECSCALE_DECODE_PROFILE_DIR")
    if folder:
        return Path(folder).expanduser()
    return Path(os.environ.get("SPECSCALE_CACHE_DIR", "~/.cache/specscale")).expanduser() / "decode-profiles"


def device_label(device: str) -> str:
    """What the curve depends on besides the machine: the accelerator model ("NVIDIA H200"), or "cpu"."""
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"


def save_profile(profile: DecodeProfile, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_json(), indent=2) + "\n")


def load_row_budget(model: str | Path, device: str) -> int | None:
    """The row budget measured for this generator on this device and machine; None if never measured."""
    path = default_profile_path(model, device)
    if not path.is_file():
        return None
    try:
        budget = json.loads(path.read_text()).get("budget")
    except json.JSONDecodeError:
        return None
    return budget if isinstance(budget, int) and budget > 0 else None


def run_profile_decode(args) -> int:
    """`specscale profile-decode`: measure, print the curve and the budget, write the JSON."""
    import sys

    from specscale.defaults import TOY_GENERATOR

    model = args.model or (str(TOY_GENERATOR) if (TOY_GENERATOR / "config.json").is_file() else None)
    if model is None:
        print(f"no bundled toy generator at {TOY_GENERATOR}; pass --model PATH", file=sys.stderr)
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rows = tuple(int(r) for r in args.rows.split(",")) if args.rows else DEFAULT_ROWS
    config = DecodeProfileConfig(model=model, rows=rows, repeats=args.repeats, dtype=args.dtype,
                                 device=args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    profile = profile_decode(config, progress=print)
    out = Path(args.out) if args.out else default_profile_path(model, config.device)
    save_profile(profile, out)
    print("rows  ms/iteration  ms/row")
    for r, seconds in zip(profile.rows, profile.seconds, strict=True):
        print(f"{r:4d}  {seconds * 1e3:12.3f}  {seconds * 1e3 / r:6.3f}")
    print(f"machine: {profile.machine}\nspeculative row budget: {profile.budget} rows\nwrote {out}")
    return 0
