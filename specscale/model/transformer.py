"""One decoder for Qwen2 / Qwen2.5 and Llama 3.x, with a causal-LM head or a process-reward head.

Every per-call input is passed explicitly: token ids, positions, the per-layer KV caches and the
attention metadata of the batch (slot mapping, block tables, masks). There is no global context.
Tokens of a batch are flattened: T = total new tokens of all sequences in this iteration.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specscale.model import cpu_kernels
from specscale.model.attention import AttentionMetadata, paged_attention, write_kv
from specscale.model.kernel_choice import PREFILL_BUCKETS, ROW_BUCKETS, KernelChoice
from specscale.model.linear import Linear, TiedEmbedding


@dataclass(frozen=True)
class ModelArgs:
    """The architecture fields of a Hugging Face `config.json` that the decoder needs."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    num_labels: int = 2

    @classmethod
    def from_hf_config(cls, config: dict) -> ModelArgs:
        architecture = config.get("architectures", [""])[0]
        num_heads = config["num_attention_heads"]
        rope = config.get("rope_parameters") or {}  # transformers >= 5 keeps rope settings here
        rope_theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
        scaling = config.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        if rope_kind(scaling) == "yarn":  # transformers' default for a YaRN config without it
            scaling = {"original_max_position_embeddings": config.get("max_position_embeddings", 4096), **scaling}
        is_qwen2 = config.get("model_type") == "qwen2"
        return cls(
            architecture=architecture,
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=scaling,
            max_position_embeddings=context_length(config, scaling),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=is_qwen2 or bool(config.get("attention_bias", False)),
            num_labels=2,
        )


def rope_kind(scaling: dict | None) -> str:
    scaling = scaling or {}
    return scaling.get("rope_type") or scaling.get("type") or "default"


def context_length(config: dict, scaling: dict | None) -> int:
    """Positions the model serves: max_position_embeddings, or with YaRN original x factor when that is
    longer (the Qwen2.5 model cards keep max_position_embeddings at the pretraining 32,768 and add
    {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768} for 131,072)."""
    declared = config.get("max_position_embeddings", 4096)
    if rope_kind(scaling) != "yarn":
        return declared
    return max(declared, int(scaling["original_max_position_embeddings"] * (scaling.get("factor") or 1.0)))


def rope_inverse_frequencies(args: ModelArgs) -> torch.Tensor:
    """inv_freq[i] = theta^(-2i/D), rescaled per Llama 3's or YaRN's rule when rope_scaling names one."""
    d = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))  # [D/2]
    kind = rope_kind(args.rope_scaling)
    if kind == "llama3":
        return _llama3_scaled(inv_freq, args.rope_scaling)
    if kind == "yarn":
        return _yarn_scaled(inv_freq, args.rope_scaling, args.rope_theta, args.max_position_embeddings)
    if kind != "default":
        raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: default, llama3, yarn)")
    return inv_freq


def rope_attention_factor(args: ModelArgs) -> float:
    """The factor cos and sin are multiplied by: 1, or YaRN's attention temperature 0.1 ln(s) + 1 (its
    `attention_factor` when given; the mscale / mscale_all_dim ratio when both are given)."""
    scaling = args.rope_scaling or {}
    if rope_kind(scaling) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = _yarn_factor(scaling, args.max_position_embeddings)
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
    return _yarn_mscale(factor, 1.0)


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_factor(scaling: dict, context: int) -> float:
    factor = scaling.get("factor")
    return factor if factor is not None else context / scaling["original_max_position_embeddings"]


def _yarn_scaled(inv_freq: torch.Tensor, scaling: dict, theta: float, context: int) -> torch.Tensor:
    # YaRN ("NTK-by-parts"): frequencies that turn more than beta_fast times over the original context
    # are kept, those that turn fewer than beta_slow times are divided by `factor`, and a linear ramp
    # over the dimension index blends the band between (docs/bench/real-size.md).
    factor = _yarn_factor(scaling, context)
    original = scaling["original_max_position_embeddings"]
    d = 2 * inv_freq.shape[0]
    low = _yarn_dimension(scaling.get("beta_fast") or 32, d, theta, original)
    high = _yarn_dimension(scaling.get("beta_slow") or 1, d, theta, original)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    span = high - low if high != low else 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / span).clamp(0, 1)  # [D/2] 0: keep, 1: divide
    return inv_freq / factor * ramp + inv_freq * (1 - ramp)


def _yarn_dimension(rotations: float, d: int, theta: float, original: int) -> float:
    """The (fractional) dimension index whose frequency turns `rotations` times over `original` positions."""
    return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))


def _llama3_scaled(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    # Long wavelengths (low frequencies) are divided by `factor`, short ones kept, the band between
    # low_freq_factor and high_freq_factor interpolated smoothly.
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    original = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


@dataclass(frozen=True)
class RopeInputs:
    """RoPE inputs of one iteration. cos, sin: the rows of each token, [T, D] — or, for the C++ kernels
    (AttentionMetadata.use_cpu_kernels), the whole [P, D] tables, which the kernel indexes by positions."""

    positions: torch.Tensor  # [T]
    cos: torch.Tensor
    sin: torch.Tensor


class RotaryTable:
    """cos/sin of every position up to max_positions, computed once; rows are gathered per batch."""

    def __init__(self, args: ModelArgs, max_positions: int, device: torch.device, dtype: torch.dtype):
        inv_freq = rope_inverse_frequencies(args).to(device)  # [D/2]
        positions = torch.arange(max_positions, device=device, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]  # [P, D/2]
        angles = torch.cat([freqs, freqs], dim=-1)  # [P, D]
        attention_factor = rope_attention_factor(args)
        self.cos = (angles.cos() * attention_factor).to(dtype)
        self.sin = (angles.sin() * attention_factor).to(dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions], self.sin[positions]  # [T, D] each


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; rotate-half RoPE as in Qwen2 / Llama: x*cos + rotate_half(x)*sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class RMSNorm(nn.Module):
    """RMSNorm with the residual add in front of it: (x, residual) -> (norm(x + residual), x + residual)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x, residual: torch.Tensor | None, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """x, residual: [T, h]; residual None means x is the residual stream itself.

        fused: one C++ kernel (CPU), which updates `residual` in place to x + residual.
        """
        if fused:
            return cpu_kernels.add_rms_norm(x, residual, self.weight, self.eps), x if residual is None else residual
        if residual is not None:
            x = x + residual
        return self.normalise(x), x

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        # Like the reference: normalise in fp32, round to the activation dtype, then scale.
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), None, self.eps).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_heads, args.num_kv_heads, args.head_dim
        q_size, kv_size = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
        self.split_sizes = [q_size, kv_size, kv_size]
        self.qkv_proj = Linear(args.hidden_size, q_size + 2 * kv_size, bias=args.attention_bias)
        self.o_proj = Linear(q_size, args.hidden_size, bias=False)
        self.scale = args.head_dim**-0.5

    def forward(self, x, rope: RopeInputs, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)  # [T, (H + 2 KVH) * D]
        key_cache, value_cache = kv_cache
        if meta.use_cpu_kernels:
            q = cpu_kernels.rope_write_kv(qkv, rope.positions, rope.cos, rope.sin, key_cache, value_cache,
                                          meta.slot_mapping, self.num_heads, self.num_kv_heads)  # [T, H, D]
        else:
            q, k, v = qkv.split(self.split_sizes, dim=-1)  # [T, H*D], [T, KVH*D] x2
            q = apply_rotary(q.view(t, self.num_heads, self.head_dim), rope.cos, rope.sin)  # [T, H, D]
            k = apply_rotary(k.view(t, self.num_kv_heads, self.head_dim), rope.cos, rope.sin)  # [T, KVH, D]
            write_kv(key_cache, value_cache, k, v.view(t, self.num_kv_heads, self.head_dim), meta.slot_mapping)
        out = paged_attention(q, key_cache, value_cache, meta, self.scale)  # [T, H, D]
        return self.o_proj(out.reshape(t, -1))


# Most rows of one MLP pass on CPU. A long prefill runs its MLP in equal chunks of at most this many tokens so
# that the [rows, 2I] gate/up output and the [rows, I] product stay in the last-level cache instead of a round
# trip through memory (8,192 tokens of a 0.5B model: 160 MB; docs/bench/real-size.md). oneDNN
# computes a row the same way in any pass of >= 7 rows, and equal chunks hold >= MLP_CHUNK_ROWS / 2 rows, so
# the result is bit-identical to one pass.
MLP_CHUNK_ROWS = int(os.environ.get("SPECSCALE_MLP_CHUNK_ROWS", "512"))


def equal_chunks(rows: int, most: int) -> range:
    """Start rows of ceil(rows / most) chunks of (nearly) equal size, each at most `most` rows."""
    count = -(-rows // most)
    return range(0, rows, -(-rows // count))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_up_proj = Linear(args.hidden_size, 2 * args.intermediate_size, bias=False)
        self.down_proj = Linear(args.intermediate_size, args.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, fused: bool) -> torch.Tensor:
        """x [T, h] -> [T, h]; on CPU in chunks of MLP_CHUNK_ROWS tokens (see there)."""
        rows = x.shape[0]
        if x.device.type != "cpu" or rows <= MLP_CHUNK_ROWS:
            return self.project(x, fused)
        out = torch.empty_like(x)  # [T, h]
        starts = equal_chunks(rows, MLP_CHUNK_ROWS)
        for start in starts:
            out[start : start + starts.step] = self.project(x[start : start + starts.step], fused)
        return out

    def project(self, x: torch.Tensor, fused: bool) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [T, 2I]
        if fused:
            return self.down_proj(cpu_kernels.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)  # [T, I] each
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = MLP(args)

    def forward(self, x, residual, rope: RopeInputs, kv_cache, meta: AttentionMetadata,
                keep_rows: torch.Tensor | None = None):
        """(x, residual) -> (mlp output, residual stream before it); the caller adds the two (next norm).

        keep_rows [R]: after attention (every token's K and V are written and every row attends), only these
        rows go on through o_proj's residual, the norm and the MLP: the output is [R, h]."""
        fused = meta.use_cpu_kernels
        h, residual = self.input_layernorm(x, residual, fused)
        h = self.self_attn(h, rope, kv_cache, meta)
        if keep_rows is not None:
            h, residual = h.index_select(0, keep_rows), residual.index_select(0, keep_rows)  # [R, h] each
        h, residual = self.post_attention_layernorm(h, residual, fused)
        return self.mlp(h, fused), residual


class DecoderModel(nn.Module):
    """Embedding, decoder layers and final norm: token ids -> last hidden states [T, hidden]."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        # no random init: the loader builds on the meta device and fills every weight from the checkpoint, and
        # nn.Embedding's normal_ init would import torch._dynamo (1.1-1.5 s at every start) for nothing
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size,
                                         _weight=torch.empty(args.vocab_size, args.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(args) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(self, input_ids, rope: RopeInputs, kv_caches, meta: AttentionMetadata,
                output_rows: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids [T] -> final hidden states [T, h], or [R, h] for output_rows [R] only.

        Only the last layer can drop rows (its K/V are written for all of them; earlier layers' outputs are
        every later token's input): the rest of it runs on the R rows a head reads, which for a PRM scoring
        a step tag every few dozen tokens, or a prompt's prefill, is most of that layer's work saved."""
        x, residual = self.embed_tokens(input_ids), None  # [T, h]; the residual stream is x until layer 0 adds
        last = len(self.layers) - 1
        for index, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            x, residual = layer(x, residual, rope, kv_cache, meta, output_rows if index == last else None)
        return self.norm(x, residual, meta.use_cpu_kernels)[0]


class TransformerForCausalLM(nn.Module):
    """Qwen2ForCausalLM / LlamaForCausalLM: hidden states -> next-token logits over the vocabulary."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = DecoderModel(args)
        self.lm_head = Linear(args.hidden_size, args.vocab_size, bias=False)
        self.rotary: RotaryTable | None = None

    @property
    def output_size(self) -> int:
        return self.args.vocab_size

    row_buckets = ROW_BUCKETS  # the rows its linears run (model/kernel_choice.py): decode and prefill

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    def tie_weights(self) -> None:
        if self.args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def tied_head(self) -> Linear | None:
        return self.lm_head if self.args.tie_word_embeddings else None

    def prepack_linears(self, choice: KernelChoice) -> None:
        """Lay every linear weight out once for the path `choice` picks for it (CPU; see Linear); a tied head
        then also serves the embedding lookups from its one copy (TiedEmbedding)."""
        if self.device.type != "cpu":
            return
        tied = self.tied_head()
        for module in self.modules():
            if isinstance(module, Linear):
                candidates = module.paths(tied=module is tied)
                module.prepack(choice.linear_path(module.shape, candidates, self.row_buckets, module is tied))
        if tied is not None:
            self.model.embed_tokens = TiedEmbedding(tied)

    def build_rotary(self, max_positions: int) -> None:
        self.rotary = RotaryTable(self.args, max_positions, self.device, self.dtype)

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata,
                output_rows: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, positions: [T] -> final hidden states [T, hidden] (or [R, hidden] of output_rows [R])."""
        if meta.use_cpu_kernels:  # the kernel reads each token's row of the tables itself
            rope = RopeInputs(positions, self.rotary.cos, self.rotary.sin)
        else:
            rope = RopeInputs(positions, *self.rotary.lookup(positions))
        return self.model(input_ids, rope, kv_caches, meta, output_rows)

    def compute_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)  # [n, vocab]


class TransformerForProcessReward(TransformerForCausalLM):
    """Qwen2ForProcessRewardModel: Qwen2 body + score = Linear(h, h) -> ReLU -> Linear(h, 2) per token."""

    row_buckets = PREFILL_BUCKETS  # a PRM only prefills (its score head is a small share of the work)

    def __init__(self, args: ModelArgs):
        nn.Module.__init__(self)
        self.args = args
        self.model = DecoderModel(args)
        h = args.hidden_size
        self.score = nn.Sequential(Linear(h, h), nn.ReLU(), Linear(h, args.num_labels))
        self.rotary = None

    @property
    def output_size(self) -> int:
        return self.args.num_labels

    def tie_weights(self) -> None:
        return None

    def tied_head(self) -> Linear | None:
        return None

    def compute_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.score(hidden)  # [n, 2]
