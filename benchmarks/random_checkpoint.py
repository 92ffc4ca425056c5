"""Random-weight checkpoints in the real Qwen2.5 shapes (full 151,936-token vocabularies), for benchmarks.

Built once and cached under ~/.cache/specscale/random-checkpoints/<name> ($SPECSCALE_CACHE_DIR moves
it): config.json in the Hugging Face layout (model_type qwen2, so transformers and vLLM load it too),
sharded bf16 safetensors with the Hugging Face weight names, and a word-level tokenizer.json with one
token per id, so every sampled id decodes. The shapes are the Qwen2.5 model cards' (0.5B, 1.5B, 7B
generators; "7b-prm" is Qwen2.5-Math-PRM-7B's body with its 2-class score head, "0.5b-prm" the same head on
an untied Qwen2.5-0.5B body, architectures `Qwen2ForProcessRewardModel`, for the PRM prefill benchmark
benchmarks/prm_throughput.py). `write_checkpoint` writes any `Shape` into a given folder (tests use tiny ones).

    python benchmarks/random_checkpoint.py 0.5b 1.5b     # prints each folder
    python benchmarks/random_checkpoint.py 7b 7b-prm --device cuda   # draws the weights on the GPU (faster)
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

VOCAB = 151_936


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool
    prm: bool = False

    @property
    def linear_parameters(self) -> int:
        """Weights of the linears a token runs through (attention projections, MLP, head): 2 FLOPs each."""
        head_dim = self.hidden // self.heads
        attention = self.hidden * (self.heads + 2 * self.kv_heads) * head_dim + self.heads * head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        head = self.hidden * self.hidden + 2 * self.hidden if self.prm else self.hidden * VOCAB
        return self.layers * (attention + mlp) + head


SHAPES = {
    "0.5b": Shape(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, tied=True),
    "1.5b": Shape(hidden=1536, intermediate=8960, layers=28, heads=12, kv_heads=2, tied=True),
    "7b": Shape(hidden=3584, intermediate=18944, layers=28, heads=28, kv_heads=4, tied=False),
    "7b-prm": Shape(hidden=3584, intermediate=18944, layers=28, heads=28, kv_heads=4, tied=False, prm=True),
    "0.5b-prm": Shape(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, tied=False, prm=True),
}


def cache_dir() -> Path:
    root = Path(os.environ.get("SPECSCALE_CACHE_DIR", Path.home() / ".cache" / "specscale"))
    return root / "random-checkpoints"


def random_checkpoint(name: str, seed: int = 0, device: str = "cpu") -> Path:
    """The folder of the named shape's checkpoint, built on first use (minutes for the larger ones)."""
    path = cache_dir() / f"qwen2.5-{name}-random"
    if not (path / "config.json").is_file():
        write_checkpoint(path, SHAPES[name], seed, device)
    return path


def write_checkpoint(path: Path, shape: Shape, seed: int = 0, device: str = "cpu") -> Path:
    """Write a random-weight checkpoint of this shape into path (created if missing)."""
    path.mkdir(parents=True, exist_ok=True)
    _write_tokenizer(path)
    _write_weights(path, shape, seed, device)
    (path / "config.json").write_text(json.dumps(_config(shape), indent=2))  # last: marks the folder complete
    return path


def _config(shape: Shape) -> dict:
    return {
        "architectures": ["Qwen2ForProcessRewardModel" if shape.prm else "Qwen2ForCausalLM"],
        "model_type": "qwen2", "vocab_size": VOCAB, "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate, "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads, "hidden_act": "silu",
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": shape.tied, "torch_dtype": "bfloat16", "bos_token_id": 151643,
        "eos_token_id": 151645, "use_sliding_window": False, "sliding_window": None, "attention_dropout": 0.0,
    }


def _write_weights(path: Path, shape: Shape, seed: int, device: str) -> None:
    generator = torch.Generator(device=device).manual_seed(seed)
    weight_map: dict[str, str] = {}
    shards = [("model.embed_tokens.weight", "model.norm.weight", *(["lm_head.weight"] if not (shape.tied or shape.prm) else []))]
    shards += [tuple(f"model.layers.{i}." for i in range(start, min(start + 4, shape.layers)))
               for start in range(0, shape.layers, 4)]
    for index, names in enumerate(shards):
        tensors = {}
        for name in names:
            tensors.update(_tensors(name, shape, generator))
        if index == 0 and shape.prm:
            tensors.update(_score_head(shape, generator))
        file = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(path / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _tensors(name: str, shape: Shape, generator: torch.Generator) -> dict[str, torch.Tensor]:
    h, head_dim = shape.hidden, shape.hidden // shape.heads
    if name.endswith("norm.weight"):
        return {name: torch.ones(h, dtype=torch.bfloat16)}
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return {name: _normal((VOCAB, h), generator)}
    q, kv = shape.heads * head_dim, shape.kv_heads * head_dim
    sizes = {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
             "self_attn.o_proj": (h, q), "mlp.gate_proj": (shape.intermediate, h),
             "mlp.up_proj": (shape.intermediate, h), "mlp.down_proj": (h, shape.intermediate)}
    tensors = {f"{name}{part}.weight": _normal(size, generator) for part, size in sizes.items()}
    for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
        tensors[f"{name}{part}.bias"] = _normal((sizes[part][0],), generator)
    tensors[f"{name}input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    tensors[f"{name}post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    return tensors


def _score_head(shape: Shape, generator: torch.Generator) -> dict[str, torch.Tensor]:
    h = shape.hidden
    return {"score.0.weight": _normal((h, h), generator), "score.0.bias": _normal((h,), generator),
            "score.2.weight": _normal((2, h), generator), "score.2.bias": _normal((2,), generator)}


def _normal(size: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    values = torch.randn(size, generator=generator, device=generator.device) * 0.02
    return values.to(torch.bfloat16).cpu()


def _write_tokenizer(path: Path) -> None:
    """A word-level tokenizer with one token per id ("t0 t1 ..."), the Qwen2.5 special tokens at their ids
    (<extra_0>, Qwen2.5-Math-PRM's step separator, included)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>", 151651: "<extra_0>"}
    vocab = {specials.get(i, f"t{i}"): i for i in range(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(list(specials.values()))
    tokenizer.save(str(path / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
              "tokenizer_class": "PreTrainedTokenizerFast",
              "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                               "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="+", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cpu", help="where the random weights are drawn (cuda is faster)")
    args = parser.parse_args()
    for name in args.names:
        print(random_checkpoint(name, device=args.device), flush=True)


if __name__ == "__main__":
    main()
