"""Loading the bundled toy generator and PRM with ``transformers``.

``load_toy_models(generator_dir, prm_dir, dtype)`` returns ``ToyModels``: the ``Qwen2ForCausalLM``
generator, the ``Qwen2ForProcessRewardModel`` PRM (through ``specscale.verify.hf_prm``), and their
tokenizers. Defaults: the checkpoints in ``specscale/assets`` (``TOY_GENERATOR_DIR``, ``TOY_PRM_DIR``),
in bf16, the dtype they are served in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from specscale.verify.hf_prm import Qwen2ForProcessRewardModel
from specscale_lab.tasks.toy import STEP_SEPARATOR, TOY_GENERATOR_DIR, TOY_PRM_DIR, generator_messages


@dataclass(frozen=True)
class ToyModels:
    """The generator and PRM with their tokenizers."""

    generator: AutoModelForCausalLM
    gen_tokenizer: PreTrainedTokenizerBase
    prm: Qwen2ForProcessRewardModel
    prm_tokenizer: PreTrainedTokenizerBase

    def prompt(self, question: str) -> list[int]:
        """Token ids of the generation prompt of ``question``."""
        text = self.gen_tokenizer.apply_chat_template(
            generator_messages(question), tokenize=False, add_generation_prompt=True
        )
        return self.gen_tokenizer.encode(text, add_special_tokens=False)

    def text(self, ids: list[int]) -> str:
        """Generated ids as text, special tokens dropped."""
        return str(self.gen_tokenizer.decode(ids, skip_special_tokens=True))  # one sequence: one string

    def stop_ids(self) -> list[int]:
        """The step end (``"\\n\\n"``, one token) and the end of the answer (``<|im_end|>``)."""
        step_end = self.gen_tokenizer.encode(STEP_SEPARATOR, add_special_tokens=False)
        return [*step_end, self.gen_tokenizer.eos_token_id]


def load_toy_models(
    generator_dir: Path = TOY_GENERATOR_DIR, prm_dir: Path = TOY_PRM_DIR, dtype: torch.dtype = torch.bfloat16
) -> ToyModels:
    """Load both checkpoints (eval mode) and their tokenizers."""
    generator = AutoModelForCausalLM.from_pretrained(generator_dir, dtype=dtype).eval()
    prm = Qwen2ForProcessRewardModel.from_pretrained(prm_dir, dtype=dtype).eval()
    return ToyModels(generator, AutoTokenizer.from_pretrained(generator_dir), prm, AutoTokenizer.from_pretrained(prm_dir))
