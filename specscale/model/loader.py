"""Local Hugging Face folder -> model modules: config.json, single or sharded safetensors, registry.

Checkpoint weights keep their Hugging Face names; q/k/v projections are fused into `qkv_proj` and
gate/up into `gate_up_proj` while loading. No remote code from a checkpoint is ever executed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open

from specscale.model.kernel_choice import KernelChoice
from specscale.model.kernel_timing import measured_choice
from specscale.model.transformer import ModelArgs, TransformerForCausalLM, TransformerForProcessReward

log = logging.getLogger(__name__)

MODEL_REGISTRY: dict[str, type[TransformerForCausalLM]] = {
    "Qwen2ForCausalLM": TransformerForCausalLM,
    "LlamaForCausalLM": TransformerForCausalLM,
    "Qwen2ForProcessRewardModel": TransformerForProcessReward,
}

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_FUSED = {  # HF name part -> (our fused name part, index of the slice)
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def read_hf_config(path: str | Path) -> dict:
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"no config.json in {path}: expected a local Hugging Face model folder")
    return json.loads(config_file.read_text())


def resolve_dtype(dtype: str, config: dict) -> torch.dtype:
    if dtype != "auto":
        return _DTYPES[dtype]
    name = config.get("torch_dtype") or config.get("dtype") or "float32"
    return _DTYPES.get(name, torch.float32)


def safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / shard for shard in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path}")
    return files


def model_class_for(config: dict) -> type[TransformerForCausalLM]:
    architectures = config.get("architectures") or []
    for name in architectures:
        if name in MODEL_REGISTRY:
            return MODEL_REGISTRY[name]
    raise ValueError(f"unsupported architectures {architectures}; supported: {sorted(MODEL_REGISTRY)}")


def load_model(path: str | Path, dtype: str = "auto", device: str = "cpu", max_positions: int | None = None,
               kernels: str | KernelChoice = "auto"):
    """Build the registered model class for the folder's config and fill it from its safetensors; on CPU
    every linear takes the path `kernels` picks (a KernelChoice, or its mode: "auto" takes the fastest
    measured here, model/kernel_choice.py), kept as `model.kernel_choice`."""
    path = Path(path)
    config = read_hf_config(path)
    args = ModelArgs.from_hf_config(config)
    torch_dtype = resolve_dtype(dtype, config)
    with torch.device("meta"):
        model = model_class_for(config)(args).to(torch_dtype)
    model = model.to_empty(device=device)
    _load_weights(model, path, torch_dtype)
    model.tie_weights()
    model.kernel_choice = kernels if isinstance(kernels, KernelChoice) else measured_choice(kernels)
    model.prepack_linears(model.kernel_choice)
    log.info("%s: %s", path.name, model.kernel_choice.describe())
    model.build_rotary(max_positions or args.max_position_embeddings)
    return model.eval()


def _load_weights(model: TransformerForCausalLM, path: Path, dtype: torch.dtype) -> None:
    params = dict(model.named_parameters())
    filled: dict[str, int] = {}
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                _copy_weight(model.args, params, filled, name, handle.get_tensor(name).to(dtype))
    expected = _expected_fills(model, params)
    missing = sorted(name for name, count in expected.items() if filled.get(name, 0) != count)
    if missing:
        raise ValueError(f"checkpoint {path} lacks weights for {missing[:8]}")


def _copy_weight(args: ModelArgs, params, filled, name: str, tensor: torch.Tensor) -> None:
    if name == "lm_head.weight" and "lm_head.weight" not in params:
        return  # a PRM checkpoint may carry an unused LM head
    for hf_part, (our_part, index) in _FUSED.items():
        if hf_part in name:
            target = name.replace(hf_part, our_part)
            _fused_slice(args, params[target], our_part, index).copy_(tensor)
            filled[target] = filled.get(target, 0) + 1
            return
    if name not in params:
        raise ValueError(f"unexpected weight {name!r} in checkpoint")
    params[name].data.copy_(tensor)
    filled[name] = filled.get(name, 0) + 1


def _fused_slice(args: ModelArgs, param: torch.Tensor, fused: str, index: int) -> torch.Tensor:
    if fused.endswith("qkv_proj"):
        q, kv = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
        sizes = [q, kv, kv]
    else:
        sizes = [args.intermediate_size, args.intermediate_size]
    start = sum(sizes[:index])
    return param.data.narrow(0, start, sizes[index])


def _expected_fills(model: TransformerForCausalLM, params: dict) -> dict[str, int]:
    expected = {}
    for name in params:
        if name == "lm_head.weight" and model.args.tie_word_embeddings:
            continue
        expected[name] = 3 if "qkv_proj" in name else 2 if "gate_up_proj" in name else 1
    return expected
