"""Frozen configuration dataclasses shared by the engine, the verifier and the search runtime."""

from __future__ import annotations

from dataclasses import dataclass

KERNEL_MODES = ("auto", "ours", "onednn", "transposed", "torch")  # EngineConfig.kernels (model/kernel_choice.py)


@dataclass(frozen=True)
class EngineConfig:
    """How one engine (a model, its KV pool and its scheduler) is set up.

    model: a local Hugging Face folder (config.json, *.safetensors, tokenizer files).
    dtype: "float32", "bfloat16" or "float16"; "auto" takes the checkpoint's dtype (config.json
        `torch_dtype` / `dtype`; float32 when it names none).
    block_size: tokens per KV block.
    num_kv_blocks: KV pool size in blocks; None sizes it from kv_cache_memory_gb.
    max_num_batched_tokens: token budget of one iteration (decode rows + prefill chunks).
    max_num_seqs: most sequences in one iteration.
    spare_rows: low-priority (priority < 0, i.e. speculative) rows only fill an iteration up to this
        many rows in total — the batch size past which another row costs a full row's compute on
        this device; None lets them fill max_num_seqs.
    max_model_len: context cap per sequence; None takes the model's max_position_embeddings.
    enable_prefix_caching: reuse full KV blocks whose content hash matches (automatic prefix caching).
    attention_backend: "auto" (the C++ CPU kernels — decode attention and the fused norm / RoPE / activation
        ops — when they build), "torch" (plain torch everywhere) or "cpp" (the kernels, or an error).
    kernels: the path of every CPU linear: "auto" (the fastest measured on this machine, cached per machine;
        model/kernel_choice.py), or forced "ours" (our bf16 kernel), "onednn", "transposed" ((W x^T)^T) or
        "torch" (F.linear) where it can run that weight.
    seed: seeds the engine's generator, used by sequences without a seed of their own.
    """

    model: str
    dtype: str = "auto"
    device: str = "cpu"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_gb: float = 1.0
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    spare_rows: int | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    attention_backend: str = "auto"
    kernels: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.max_num_batched_tokens <= 0:
            raise ValueError(f"max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}")
        if self.max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs must be positive, got {self.max_num_seqs}")
        if self.spare_rows is not None and self.spare_rows < 0:
            raise ValueError(f"spare_rows must be >= 0 or None, got {self.spare_rows}")
        if self.kernels not in KERNEL_MODES:
            raise ValueError(f"kernels must be one of {KERNEL_MODES}, got {self.kernels!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")


AGGREGATIONS = ("last", "min", "prod", "mean")
# The server's request schema (server/protocol.py) reads the lazy-flush policies' names here; the registry in
# runtime/lazy_flush.py is their source (LAZY_FLUSH, tests/test_policy_registry.py holds the two equal) and this
# copy goes once the schema reads runtime/lazy_flush.py's LV_POLICIES.
LV_POLICIES = ("fixed", "adaptive")
LV_FLUSH_SCOPES = ("queue", "request")
LV_GROUPS = ("siblings", "round")
BRANCHING_SCORES = ("decided", "lookahead")


@dataclass(frozen=True)
class SearchConfig:
    """One search: its size, sampling, and the policies a variant is composed of.

    beam_size N logical candidates per round, beam_width M children per retained path (k = N / M
    retained). selection: "beam" (global top-k), "dvts" (top-1 per sibling group), "best_of_n"
    (N full samples, one round). speculation: the speculation policy's name (search/speculation.py), "none"
    or "eager" (verified candidates are expanded before their round is decided, up to speculation_depth
    rounds ahead of the last decided round); rank_speculation: the engine runs speculative rows in order of
    their parent's survival rank in its round (False: oldest first, an ablation). pruning: the early-pruning
    policy's name (search/pruning.py), "none", "strict" or "strict_ties"; perfect_shortcut: the
    perfect-score shortcut, a separate switch (docs/design.md, "Early pruning"). Every policy field (selection,
    verification, speculation, pruning, lv_policy, and the switches perfect_shortcut, dedup, lookahead) names a
    class registered in its kind's registry (`search/registry.py`); the names are checked when the policies are
    built (`search/presets.py` `preset_config`, `Search`, the runtime's `flush_policy`; lv_policy here too, for
    now: LV_POLICIES above). dedup: computation deduplication (CD). verification: "round" (a
    request's whole round at once, batched across requests), "immediate" (each step as it finishes),
    "lazy" (queued as it finishes, flushed on the lazy-verification triggers), "lazy_round" (a round at once,
    queued as "lazy" is: an ablation), "per_request" (FastTTS: one PRM call per round per request). lv_policy: which triggers flush lazy steps, "fixed" (threshold, sibling group,
    deferral and age caps) or "adaptive" (sibling group, or waiting time, speculative work and KV pressure
    against the lv_*_budget fields; runtime/lazy_flush.py); the token threshold is the verifier's (the
    runtime's), never a request's. lv_flush_scope: what a trigger flushes, "queue" (every queued lazy step of
    every request: the paper's lazy verification) or "request" (the triggering request's steps only: an
    ablation). lv_ride_along: lazy steps join any PRM batch that runs anyway (None: on with the queue scope;
    with the request scope, on for adaptive only). lv_sibling_trigger: a complete sibling group flushes the
    queue (docs/design.md, "Verification"; False drops it: an ablation, in no preset). lv_group: the group
    whose completion that trigger waits for, "round" (every candidate of the request's round: with N > M one
    flush per round instead of N / M; the default, chosen by the ladders in docs/bench/lv-group.md) or
    "siblings" (the M children of one parent, the paper's literal reading); the same when N = M.
    lookahead / dynamic_branching / lookahead_head_start(_std) / max_live_sequences:
    the FastTTS pieces (LookAhead continuations, children by min-subtracted score, the mean and spread of
    the share of a continuation's tokens every other retained copy starts from, the per-request valve).
    branching_score: which score dynamic branching weighs, "decided" (the one the round was decided on)
    or "lookahead" (FastTTS's code: the path's score with its LookAhead step when that step finished and
    was scored with the round; search/branching.py).
    filter_duplicates: identical paths compete as one in selection (search-and-learn's option).
    early_exit: the early-exit policy's name (search/early_exit.py), "none", "exact" (stop once the best
    completed path can no longer be overtaken: the same answer), "certain" (the best completed path scores at
    least exit_certainty and ranks above every running path's current score), "stall" (the best retained path's
    score has not risen for exit_stall_rounds decided rounds and is below exit_floor), "exact+stall" or "certain+stall".
    partial_rejection: the partial-step rejection policy's name (search/partial_rejection.py), "off" or "kth" (a
    running step's first partial_tokens tokens are scored by the PRM, and the step is stopped when that score is
    below its round's k-th best verified score, or the k-th best partial score once more than k are in, by more
    than partial_margin).
    retention: which copies a beam round keeps (search/retention.py), "score" (the k best) or "kv" (within
    retention_margin of the k-th best score: a new written answer first, then the fewest tokens of KV added to
    the kept paths; ETS).
    All of them: docs/design.md.
    """

    beam_size: int = 8
    beam_width: int = 4
    max_rounds: int = 40
    aggregation: str = "last"
    temperature: float = 0.8
    top_p: float = 1.0
    max_step_tokens: int = 2048
    seed: int | None = None
    selection: str = "beam"
    speculation: str = "none"
    speculation_depth: int = 1
    rank_speculation: bool = True
    pruning: str = "none"
    perfect_shortcut: bool = False
    dedup: bool = False
    verification: str = "round"
    lv_max_deferrals: int = 6
    lv_max_age_s: float = 2.0
    lv_policy: str = "fixed"
    lv_flush_scope: str = "queue"
    lv_ride_along: bool | None = None
    lv_sibling_trigger: bool = True
    lv_group: str = "round"
    lv_wait_budget_calls: float = 2.0
    lv_speculative_budget_tokens: float = 512.0
    lv_kv_budget: float = 0.9
    lookahead: bool = False
    dynamic_branching: bool = False
    lookahead_head_start: float = 0.85
    lookahead_head_start_std: float = 0.1
    max_live_sequences: int = 256
    branching_score: str = "decided"
    filter_duplicates: bool = False
    early_exit: str = "none"
    exit_certainty: float = 0.9
    exit_stall_rounds: int = 2
    exit_floor: float = 0.5
    partial_rejection: str = "off"
    partial_tokens: int = 16
    partial_margin: float = 0.1
    retention: str = "score"
    retention_margin: float = 0.05

    def __post_init__(self) -> None:
        _check(self.beam_size >= 1, f"beam_size must be >= 1, got {self.beam_size}")
        _check(self.beam_width >= 1, f"beam_width must be >= 1, got {self.beam_width}")
        _check(self.beam_size % self.beam_width == 0,
               f"beam_size ({self.beam_size}) must be a multiple of beam_width ({self.beam_width})")
        _check(1 <= self.max_rounds <= 1000, f"max_rounds must be in [1, 1000], got {self.max_rounds}")
        _check(self.aggregation in AGGREGATIONS, f"aggregation must be one of {AGGREGATIONS}")
        _check(0 <= self.temperature <= 2, f"temperature must be in [0, 2], got {self.temperature}")
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _check(self.max_step_tokens >= 1, "max_step_tokens must be >= 1")
        _check(self.speculation_depth >= 1, "speculation_depth must be >= 1")
        _check(self.lv_max_deferrals >= 0, "lv_max_deferrals must be >= 0")
        _check(self.lv_policy in LV_POLICIES, f"lv_policy must be one of {LV_POLICIES}")
        _check(self.lv_flush_scope in LV_FLUSH_SCOPES, f"lv_flush_scope must be one of {LV_FLUSH_SCOPES}")
        _check(self.lv_group in LV_GROUPS, f"lv_group must be one of {LV_GROUPS}")
        _check(self.lv_wait_budget_calls > 0, "lv_wait_budget_calls must be > 0")
        _check(self.lv_speculative_budget_tokens > 0, "lv_speculative_budget_tokens must be > 0")
        _check(0.5 < self.lv_kv_budget <= 1, "lv_kv_budget must be in (0.5, 1]")
        _check(0 <= self.lookahead_head_start <= 1, "lookahead_head_start must be in [0, 1]")
        _check(0 <= self.lookahead_head_start_std <= 1, "lookahead_head_start_std must be in [0, 1]")
        _check(self.max_live_sequences >= 1, "max_live_sequences must be >= 1")
        _check(self.branching_score in BRANCHING_SCORES, f"branching_score must be one of {BRANCHING_SCORES}")
        _check(0 < self.exit_certainty <= 1, f"exit_certainty must be in (0, 1], got {self.exit_certainty}")
        _check(self.exit_stall_rounds >= 1, f"exit_stall_rounds must be >= 1, got {self.exit_stall_rounds}")
        _check(0 <= self.exit_floor <= 1, f"exit_floor must be in [0, 1], got {self.exit_floor}")
        _check(self.partial_tokens >= 1, f"partial_tokens must be >= 1, got {self.partial_tokens}")
        _check(0 <= self.partial_margin <= 1, f"partial_margin must be in [0, 1], got {self.partial_margin}")
        _check(0 <= self.retention_margin <= 1, f"retention_margin must be in [0, 1], got {self.retention_margin}")

    @property
    def num_retained(self) -> int:
        """k = N / M."""
        return self.beam_size // self.beam_width


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
