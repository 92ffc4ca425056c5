"""PRM throughput profiler: input tokens per second against batch size in tokens, and its knee.

Verification is a prefill-only forward pass whose throughput grows with the number of tokens in the
batch until the device saturates. Lazy verification (docs/design.md, "Verification") queues finished steps
and flushes the queue once it holds this many PRM input tokens, so the threshold is measured, once per
model and device:

- each batch is built the way the verifier builds one: `n` sequences forked from one cached context
  (question + earlier steps, `context_tokens`) and extended by `step_tokens` new tokens each (the last
  sequence takes the remainder), with one readout per sequence; a batch of B tokens runs as one forward;
- every batch size is run once to warm up, then `repeats` times, the sizes interleaved round by round
  (a slow spell on a shared machine then hits every size alike), and summarised by the median time;
- the knee is the smallest batch whose median throughput reaches 90% of the peak: the default
  lazy-verification threshold, stored in a small JSON file the search reads with `load_lv_threshold`.

`specscale profile-prm` (see `run_profile_prm`) prints the table and writes the JSON and a PNG plot; a
pipeline whose PRM has no profile on its device runs the same measurement at its start (`profile_at_start`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specscale.config import EngineConfig
from specscale.engine.engine import Engine
from specscale.engine.sequence import FinishReason
from specscale.model.loader import read_hf_config

log = logging.getLogger(__name__)

DEFAULT_BATCH_TOKENS = (256, 512, 1024, 2048, 4096, 8192)
QUICK_BATCH_TOKENS = (16, 32, 64, 128)
KNEE_FRACTION = 0.9
BLOCK_SIZE = 16


@dataclass(frozen=True)
class ProfileConfig:
    """What to measure: the PRM, the batch sizes (tokens), how often, and the shape of one sequence."""

    model: str
    batch_tokens: tuple[int, ...] = DEFAULT_BATCH_TOKENS
    repeats: int = 5
    context_tokens: int = 512  # cached prefix every sequence extends (question and earlier steps)
    step_tokens: int = 128  # new tokens per sequence (a step and its template tail)
    dtype: str = "auto"
    device: str = field(default_factory=lambda: current_device())
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.batch_tokens or min(self.batch_tokens) < 1:
            raise ValueError(f"batch_tokens must be positive, got {self.batch_tokens}")
        if self.repeats < 1 or self.context_tokens < 1 or self.step_tokens < 1:
            raise ValueError("repeats, context_tokens and step_tokens must be >= 1")


@dataclass(frozen=True)
class ProfilePoint:
    batch_tokens: int
    seconds: tuple[float, ...]  # one per repeat

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds)

    @property
    def tokens_per_s(self) -> float:
        return self.batch_tokens / self.median_seconds


@dataclass(frozen=True)
class PRMProfile:
    """A finished profile: the threshold (knee) and the table it came from."""

    model: str
    device: str
    dtype: str
    threshold: int
    points: tuple[ProfilePoint, ...]
    context_tokens: int
    step_tokens: int
    repeats: int
    cpu_threads: int  # torch's intra-op threads while measuring

    def to_json(self) -> dict:
        data = asdict(self)
        data["points"] = [
            {"batch_tokens": p.batch_tokens, "median_seconds": p.median_seconds, "tokens_per_s": p.tokens_per_s,
             "seconds": list(p.seconds)}
            for p in self.points
        ]
        return data

    @classmethod
    def from_json(cls, data: dict) -> PRMProfile:
        points = tuple(ProfilePoint(p["batch_tokens"], tuple(p["seconds"])) for p in data["points"])
        names = ("model", "device", "dtype", "threshold", "context_tokens", "step_tokens", "repeats", "cpu_threads")
        fields = {name: data[name] for name in names}
        return cls(points=points, **fields)


# ---- device and file naming ------------------------------------------------------------------------
def current_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_label(device: str) -> str:
    """What the threshold depends on: the accelerator model ("NVIDIA H200"), or "cpu"."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"


def cache_dir() -> Path:
    """$SPECSCALE_PRM_PROFILE_DIR, else prm-profiles/ in the cache folder ($SPECSCALE_CACHE_DIR)."""
    folder = os.environ.get("SPECSCALE_PRM_PROFILE_DIR")
    if folder:
        return Path(folder).expanduser()
    return Path(os.environ.get("SPECSCALE_CACHE_DIR", "~/.cache/specscale")).expanduser() / "prm-profiles"


def default_profile_path(model: str | Path, device: str) -> Path:
    """~/.cache/specscale/prm-profiles/<model>-<device>-<hash>.json for this model folder and device."""
    model_path = str(Path(model).expanduser().resolve())
    label = device_label(device)
    digest = hashlib.sha1(f"{model_path}|{label}".encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", f"{Path(model_path).name}-{label}").strip("-")
    return cache_dir() / f"{slug}-{digest}.json"


# When this PRM was never profiled and the device has no cost model: a 7-8B PRM's prefill on an A100
# saturates near 2,048 batch tokens (docs/bench/prm-threshold.md).
DEFAULT_LV_THRESHOLD = 2048


def resolve_lv_threshold(override: int | None, profiled: int | None, modelled: int | None = None) -> int:
    """The lazy-verification threshold a stack hands its runtimes: the override (`--lv-threshold`),
    else the PRM's knee measured on this device (`specscale profile-prm`'s file), else its knee on the
    device's cost model (costmodel/prm_knee.py: a simulated PRM's, or a real PRM's never profiled here), else
    DEFAULT_LV_THRESHOLD. The one rule of this property (device_resolver.py)."""
    if override is not None:
        return override
    return profiled or modelled or DEFAULT_LV_THRESHOLD


def load_lv_threshold(model: str | Path, device: str | None = None) -> int | None:
    """The lazy-verification threshold profiled for this PRM on this device; None if never profiled."""
    path = default_profile_path(model, device or current_device())
    if not path.is_file():
        return None
    try:
        threshold = json.loads(path.read_text()).get("threshold")
    except json.JSONDecodeError:
        return None
    return threshold if isinstance(threshold, int) and threshold > 0 else None


def save_profile(profile: PRMProfile, path: Path) -> None:
    """Write the profile whole or not at all (a temporary file renamed over it): processes starting together
    read either no file or a complete one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(profile.to_json(), indent=2) + "\n")
    os.replace(temporary, path)


# a PRM profiled by the system at its first start (`profile_at_start`): fewer repeats than `specscale profile-prm`
START_REPEATS = 3


def profile_at_start(model: str | Path, dtype: str, device: str, progress=None) -> int | None:
    """The LV threshold is found by profiling the PRM once per model and device, and the system does it itself
    (docs/design.md, "Verification"). A PRM with no profile on this device is profiled now (DEFAULT_BATCH_TOKENS, START_REPEATS, on
    an engine of its own that is gone before the caller builds its engines) and the profile is cached where
    `specscale profile-prm` writes it; returns its knee. None when the PRM's context is shorter than one
    profiled sequence (the caller falls back to the cost model's knee)."""
    config = ProfileConfig(model=str(model), repeats=START_REPEATS, dtype=dtype, device=device)
    max_positions = read_hf_config(model).get("max_position_embeddings")
    if isinstance(max_positions, int) and config.context_tokens + config.step_tokens > max_positions:
        log.warning("PRM %s: a context of %d positions is too short to profile; LV threshold from the cost model",
                    model, max_positions)
        return None
    log.info("PRM %s was never profiled on %s: profiling it once (the LV threshold)", model,
             device_label(device))
    profile = profile_prm(config, progress)
    save_profile(profile, default_profile_path(model, device))
    log.info("PRM %s: LV threshold %d tokens (profile cached in %s)", model, profile.threshold, cache_dir())
    return profile.threshold


# ---- measuring -------------------------------------------------------------------------------------
def knee(points: tuple[ProfilePoint, ...] | list[ProfilePoint], fraction: float = KNEE_FRACTION) -> int:
    """Smallest batch (tokens) whose median throughput reaches fraction of the peak."""
    peak = max(p.tokens_per_s for p in points)
    return min(p.batch_tokens for p in points if p.tokens_per_s >= fraction * peak)


def sequence_sizes(batch_tokens: int, step_tokens: int) -> list[int]:
    """New tokens per sequence of one batch: full steps, then the remainder."""
    sizes = [step_tokens] * (batch_tokens // step_tokens)
    return sizes + [batch_tokens % step_tokens] if batch_tokens % step_tokens else sizes


def profile_prm(config: ProfileConfig, progress=None) -> PRMProfile:
    """Measure the PRM's input-token throughput at every batch size; progress(message) after each round."""
    engine = _profiling_engine(config)
    generator = torch.Generator().manual_seed(config.seed)
    context_ids = _random_ids(generator, engine.runner.vocab_size, config.context_tokens)
    context = _run_readouts(engine, [engine.add(context_ids, None, readout_positions=[len(context_ids) - 1])])
    seconds = _measure(engine, context, config, generator, progress)
    engine.abort(context)
    points = tuple(ProfilePoint(batch, tuple(times)) for batch, times in seconds.items())
    dtype = str(engine.runner_dtype).removeprefix("torch.")
    return PRMProfile(str(Path(config.model).expanduser().resolve()), device_label(config.device), dtype,
                      knee(points), points, config.context_tokens, config.step_tokens, config.repeats,
                      torch.get_num_threads())


def _profiling_engine(config: ProfileConfig) -> Engine:
    """A PRM engine whose one iteration takes the largest batch, with KV for it and the context."""
    largest = max(config.batch_tokens)
    most_sequences = len(sequence_sizes(largest, config.step_tokens))
    blocks_per_sequence = -(-config.step_tokens // BLOCK_SIZE) + 1  # + a copy-on-write block
    engine = Engine(EngineConfig(
        model=str(config.model), dtype=config.dtype, device=config.device, block_size=BLOCK_SIZE,
        num_kv_blocks=-(-config.context_tokens // BLOCK_SIZE) + most_sequences * blocks_per_sequence + 8,
        max_num_batched_tokens=largest, max_num_seqs=most_sequences, enable_prefix_caching=False,
    ))
    if config.context_tokens + config.step_tokens > engine.max_model_len:
        raise ValueError(f"context_tokens + step_tokens = {config.context_tokens + config.step_tokens} exceeds "
                         f"the PRM context of {engine.max_model_len}")
    return engine


def _measure(engine: Engine, context: int, config: ProfileConfig, generator, progress) -> dict[int, list[float]]:
    """Seconds per run of every batch size. Round 0 warms up; later rounds interleave the sizes, so a
    slow spell on a shared machine hits all of them alike."""
    vocab = engine.runner.vocab_size
    seconds: dict[int, list[float]] = {batch: [] for batch in sorted(config.batch_tokens)}
    for repeat in range(config.repeats + 1):
        for batch, times in seconds.items():
            elapsed = _time_batch(engine, context, sequence_sizes(batch, config.step_tokens), generator, vocab)
            if repeat:
                times.append(elapsed)
        if repeat and progress is not None:
            rates = ", ".join(f"{batch}: {batch / times[-1]:,.0f}" for batch, times in seconds.items())
            progress(f"repeat {repeat}/{config.repeats}: {rates} tokens/s")
    return seconds


def _random_ids(generator: torch.Generator, vocab: int, n: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=generator).tolist()


def _run_readouts(engine: Engine, seq_ids: list[int]) -> int:
    """Step until every sequence has its readouts; returns the first id."""
    waiting = set(seq_ids)
    while waiting and engine.has_work():
        for out in engine.step():
            if out.finish_reason == FinishReason.READOUT:
                waiting.discard(out.seq_id)
    if waiting:
        raise RuntimeError(f"{len(waiting)} profiling sequences got no readouts")
    return seq_ids[0]


def _time_batch(engine: Engine, context: int, sizes: list[int], generator, vocab: int) -> float:
    """Seconds to fork the context, extend each child by its tokens and read one output per child."""
    start_position = len(engine.get(context).token_ids)
    tokens = [_random_ids(generator, vocab, n) for n in sizes]
    _synchronize(engine)
    start = time.perf_counter()
    children = engine.fork(context, len(sizes))
    for child, ids in zip(children, tokens, strict=True):
        engine.extend(child, None, token_ids=ids, readout_positions=[start_position + len(ids) - 1])
    _run_readouts(engine, children)
    _synchronize(engine)
    elapsed = time.perf_counter() - start
    for child in children:
        engine.abort(child)
    return elapsed


def _synchronize(engine: Engine) -> None:
    if engine.config.device.startswith("cuda"):
        torch.cuda.synchronize()


# ---- reporting -------------------------------------------------------------------------------------
def format_table(profile: PRMProfile) -> str:
    peak = max(p.tokens_per_s for p in profile.points)
    title = (f"PRM {profile.model} on {profile.device} ({profile.dtype}); each sequence: {profile.step_tokens} "
             f"new tokens on a {profile.context_tokens}-token cached context; median of {profile.repeats}; "
             f"{profile.cpu_threads} CPU threads")
    lines = [title, f"{'batch tokens':>12} {'median s':>10} {'tokens/s':>10} {'of peak':>8}"]
    for p in profile.points:
        mark = "  <- knee (lazy-verification threshold)" if p.batch_tokens == profile.threshold else ""
        lines.append(f"{p.batch_tokens:>12} {p.median_seconds:>10.4f} {p.tokens_per_s:>10.0f} "
                     f"{p.tokens_per_s / peak:>8.0%}{mark}")
    return "\n".join(lines)


def plot_profile(profile: PRMProfile, path: Path) -> None:
    """Throughput against batch size (median, with the range over repeats), the knee marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [p.batch_tokens for p in profile.points]
    medians = [p.tokens_per_s for p in profile.points]
    low = [m - p.batch_tokens / max(p.seconds) for m, p in zip(medians, profile.points, strict=True)]
    high = [p.batch_tokens / min(p.seconds) - m for m, p in zip(medians, profile.points, strict=True)]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.errorbar(sizes, medians, yerr=[low, high], marker="o", capsize=3, label="median (range over repeats)")
    ax.axvline(profile.threshold, color="tab:red", linestyle="--", label=f"knee = {profile.threshold} tokens")
    ax.axhline(KNEE_FRACTION * max(medians), color="gray", linestyle=":", label=f"{KNEE_FRACTION:.0%} of peak")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(size) for size in sizes])
    ax.minorticks_off()
    ax.set_xlabel("PRM batch size (input tokens)")
    ax.set_ylabel("PRM input tokens / s")
    ax.set_title(f"{Path(profile.model).name} on {profile.device} ({profile.dtype})")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_batch_tokens(text: str | None) -> tuple[int, ...]:
    return DEFAULT_BATCH_TOKENS if text is None else tuple(int(b) for b in text.split(","))


def print_progress(message: str) -> None:
    print(f"  {message}", flush=True)


def run_profile_prm(args) -> int:
    """`specscale profile-prm`: profile, print the table, write the JSON and the plot."""
    from specscale.defaults import TOY_PRM

    model = args.model or (str(TOY_PRM) if (TOY_PRM / "config.json").is_file() else None)
    if model is None:
        print(f"no bundled toy PRM at {TOY_PRM}; pass --model PATH (a local PRM folder)", file=sys.stderr)
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    quick = args.quick
    config = ProfileConfig(
        model=model,
        batch_tokens=QUICK_BATCH_TOKENS if quick else parse_batch_tokens(args.batch_tokens),
        repeats=2 if quick else args.repeats,
        context_tokens=32 if quick else args.context_tokens,
        step_tokens=16 if quick else args.step_tokens,
        dtype=args.dtype,
        device=args.device or current_device(),
    )
    profile = profile_prm(config, print_progress)
    out = Path(args.out) if args.out else default_profile_path(model, config.device)
    plot = Path(args.plot) if args.plot else out.with_suffix(".png")
    save_profile(profile, out)
    plot_profile(profile, plot)
    print(format_table(profile))
    print(f"lazy-verification threshold: {profile.threshold} tokens\nwrote {out}\nwrote {plot}")
    return 0
