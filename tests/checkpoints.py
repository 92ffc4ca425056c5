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


# ---- tiny PRM checkpoints (verifier tests) ---------------------------------------------------------
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
LLAMA31_TEMPLATE = (  # the shape of Llama 3.1's template: bos, system header with dates, trimmed turns
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\n' }}{{- 'Today Date: ' + date_string + '\\n\\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


def build_llama3_tokenizer(path: Path, vocab_size: int = 300) -> Tokenizer:
    """A byte-level BPE with Llama 3 special tokens and a Llama-3.1-style chat template ('+', '-' are tokens)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=LLAMA3_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    config = {"chat_template": LLAMA31_TEMPLATE, "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
              "tokenizer_class": "PreTrainedTokenizerFast"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return tok


def build_llama_prm_checkpoint(path: Path, seed: int = 0, max_position_embeddings: int = 512) -> Path:
    """A tiny random-weight RLHFlow-style PRM: a LlamaForCausalLM with a Llama-3.1-style tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_llama3_tokenizer(path)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6, rope_theta=500000.0, tie_word_embeddings=False,
        bos_token_id=tok.token_to_id("<|begin_of_text|>"), eos_token_id=tok.token_to_id("<|eot_id|>"),
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharper logits so P(+) spreads over [0, 1]
        model.lm_head.weight.normal_(0, 0.5)
    model.save_pretrained(path)
    return path


def build_qwen_prm_checkpoint(path: Path, seed: int = 0, **shape) -> Path:
    """A tiny random-weight Qwen2.5-Math-PRM: Qwen2 body + score head, saved in the real layout
    (`model.*`, `score.0.*`, `score.2.*`, architectures ["Qwen2ForProcessRewardModel"]); ChatML tokenizer
    holding <extra_0>. shape overrides Qwen2Config sizes (hidden_size, num_hidden_layers, ...)."""
    from safetensors.torch import save_file
    from transformers import Qwen2Config, Qwen2Model

    tok = build_tokenizer(path)
    sizes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512)
    sizes.update(shape)
    config = Qwen2Config(
        vocab_size=tok.get_vocab_size(), eos_token_id=tok.token_to_id("<|im_end|>"), rms_norm_eps=1e-6,
        rope_theta=10000.0, tie_word_embeddings=False, architectures=["Qwen2ForProcessRewardModel"], **sizes,
    )
    torch.manual_seed(seed)
    body = Qwen2Model(config)
    h = config.hidden_size
    head = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, 2))
    with torch.no_grad():
        for name, param in body.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.5)
        _calibrate_score_head(body, head, torch.tensor([tok.encode(CORPUS[0] + CORPUS[1]).ids]))
    tensors = {f"model.{name}": t.contiguous() for name, t in body.state_dict().items()}
    tensors.update({f"score.{name}": t.contiguous() for name, t in head.state_dict().items()})
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(path)
    return path


@torch.no_grad()
def _calibrate_score_head(body, head, input_ids) -> None:
    """Random hidden states share one large mean direction, which saturates a random head; rescale and
    centre its last layer so the two logits differ by about +-2 across positions: scores spread over (0, 1)."""
    hidden = body(input_ids=input_ids).last_hidden_state[0]  # [T, h]
    logits = head(hidden)  # [T, 2]
    scale = 2.0 / (logits[:, 1] - logits[:, 0]).std()
    head[2].weight.mul_(scale)
    head[2].bias.mul_(scale)
    head[2].bias.sub_(head(hidden).mean(dim=0))


def build_stepping_generator(path: Path, seed: int = 0, step_rate: float = 0.5, eos_rate: float = 0.35) -> Path:
    """A tiny random Qwen2 generator whose LM head favours "\\n\\n" and EOS, so sampled text forms
    steps and ends (about 14% "\\n\\n" and 3% EOS per token): real-engine search plumbing without the
    toy models. The rates scale the two LM-head rows along the mean hidden direction."""
    from transformers import AutoModelForCausalLM

    build_checkpoint(path, "qwen2", seed=seed, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    newline_pair, eos = tok.encode("\n\n").ids[0], tok.token_to_id("<|im_end|>")
    torch.manual_seed(seed)
    with torch.no_grad():
        hidden = model.model(torch.randint(3, 290, (8, 40))).last_hidden_state.reshape(-1, 64)
        direction = hidden.mean(0) / hidden.mean(0).norm()
        scale = 8 / hidden.norm(dim=-1).mean()
        model.lm_head.weight[newline_pair] = direction * step_rate * scale
        model.lm_head.weight[eos] = direction * step_rate * eos_rate * scale
    model.save_pretrained(path)
    return path
