"""The toy models' tokenizer: a small byte-level BPE in the Qwen2 style, built with ``tokenizers``.

- Byte-level BPE (NFC normaliser, ByteLevel pre-tokenizer and decoder, all 256 bytes in the base
  vocabulary, so every text encodes and every single token decodes to well-defined bytes).
- A Qwen2-like split regex, except that digits are always single tokens and ``"\\n\\n"`` is always its
  own pre-token (and, through a learnt merge, one token), so a step ends exactly at a token boundary.
- Special tokens after the regular vocabulary, as in Qwen2: ``<|endoftext|>`` (bos / pad),
  ``<|im_start|>``, ``<|im_end|>`` (eos), ``<extra_0>`` (the PRM's step tag).

``build_tokenizer(texts, vocab_size)`` trains it; ``save_tokenizer(tokenizer, folder, system_prompt)``
writes ``tokenizer.json`` and a ``tokenizer_config.json`` whose ChatML ``chat_template`` falls back to
``system_prompt`` when a chat has no system message (as Qwen2.5 templates do).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

BOS_PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
STEP_TAG = "<extra_0>"
SPECIAL_TOKENS = (BOS_PAD_TOKEN, IM_START, IM_END, STEP_TAG)
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
    r"|\n\n|\n|[^\S\n]+(?!\S)|[^\S\n]+"
)
MODEL_MAX_LENGTH = 2048


def build_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Train the byte-level BPE on ``texts``: at most ``vocab_size`` tokens (fewer once every
    pre-token seen twice is a single token)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    if tokenizer.encode("\n\n").ids != [tokenizer.token_to_id("ĊĊ")]:
        raise ValueError('the corpus did not teach the "\\n\\n" merge')
    return tokenizer


def chat_template(default_system_prompt: str) -> str:
    """A ChatML template (``<|im_start|>role\\n...<|im_end|>\\n``) with a default system message."""
    default = json.dumps(default_system_prompt)
    return (
        "{%- if not messages or messages[0]['role'] != 'system' %}"
        f"{{{{- '{IM_START}system\\n' + {default} + '{IM_END}\\n' }}}}"
        "{%- endif %}"
        "{%- for message in messages %}"
        f"{{{{- '{IM_START}' + message['role'] + '\\n' + message['content'] + '{IM_END}' + '\\n' }}}}"
        "{%- endfor %}"
        f"{{%- if add_generation_prompt %}}{{{{- '{IM_START}assistant\\n' }}}}{{%- endif %}}"
    )


def save_tokenizer(tokenizer: Tokenizer, folder: Path, default_system_prompt: str) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (with the chat template) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    added = {
        str(tokenizer.token_to_id(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END, STEP_TAG],
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": BOS_PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "chat_template": chat_template(default_system_prompt),
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
