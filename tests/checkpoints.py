"""Tiny random-weight checkpoints of both families, built with transformers and saved in the real layout."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<extra_0>"]
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Tom has 12 apples. He buys 7 more: 12 + 7 = 19.\n\nThen he gives away 5: 19 - 5 = 14.\n\n",
    "The answer is \\boxed{14}. Let me check: 14 + 5 = 19. Correct.\n\n",
    "Solve step by step: 3 * 4 = 12, 12 / 2 = 6, and 6 + 1 = 7.\n\n+ - = ( ) { }",
] * 20


def build_tokenizer(path: Path, vocab_size: int = 300) -> Tokenizer:
    """A byte-level BPE with digits split, '\\n\\n' as one token and ChatML special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    config = {"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None, "pad_token": "<|endoftext|>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return tok


def build_checkpoint(path: Path, family: str, seed: int = 0, dtype=torch.float32, max_shard_size=None,
                     **overrides) -> Path:
    """Save a tiny random-weight Qwen2 or Llama model (transformers) plus tokenizer into path."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tok = build_tokenizer(path)
    common = dict(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tok.token_to_id("<|im_end|>"), rms_norm_eps=1e-6,
    )
    if family == "qwen2":
        common.update(rope_theta=10000.0, tie_word_embeddings=True)
        common.update(overrides)
        config, cls = Qwen2Config(**common), Qwen2ForCausalLM
    elif family == "llama":
        common.update(
            rope_theta=500000.0, tie_word_embeddings=False,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        )
        common.update(overrides)
        config, cls = LlamaConfig(**common), LlamaForCausalLM
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = cls(config)
    with torch.no_grad():  # random init has tiny biases of zero; make them count
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.5)
    if max_shard_size is None:
        model.to(dtype).save_pretrained(path)
    else:
        model.to(dtype).save_pretrained(path, max_shard_size=max_shard_size)
    return path
