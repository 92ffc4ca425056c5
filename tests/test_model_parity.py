"""Our decoder's logits equal transformers' on tiny random checkpoints of both families (fp32)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from specscale.config import EngineConfig
from specscale.engine.engine import Engine
from specscale.engine.sequence import SamplingParams

PROMPT_LENGTHS = [3, 17, 40, 1, 33]
DECODE_STEPS = 20


class RecordingSampler:
    """Wraps the engine's sampler and keeps, per sequence, the logits row it sampled from."""

    def __init__(self, engine):
        self.inner, self.engine, self.rows = engine.sampler, engine, []

    def __call__(self, logits, rows):
        self.rows.append(logits.clone())
        return self.inner(logits, rows)


def run_engine(path, prompts, budget, backend):
    engine = Engine(EngineConfig(model=str(path), dtype="float32", num_kv_blocks=64, block_size=4,
                                 max_num_batched_tokens=budget, attention_backend=backend))
    recorded: dict[int, list[torch.Tensor]] = {}
    original = engine._sample_and_append

    def capture(to_sample):
        for row, logit_row in to_sample:
            recorded.setdefault(row.seq.seq_id, []).append(logit_row.clone())
        return original(to_sample)

    engine._sample_and_append = capture
    params = SamplingParams(temperature=0.0, max_new_tokens=DECODE_STEPS, ignore_eos=True)
    ids = [engine.add(p, params) for p in prompts]
    final = {}
    while engine.has_work():
        for out in engine.step():
            final.setdefault(out.seq_id, []).extend(out.new_token_ids)
    assert engine.block_manager.num_used_blocks == 0
    return [(prompts[i], final[sid], torch.stack(recorded[sid])) for i, sid in enumerate(ids)]


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("budget,backend", [(512, "auto"), (24, "auto"), (512, "torch")])
def test_logits_match_transformers(family, budget, backend, request):
    path = request.getfixturevalue(f"{family}_dir")
    torch.manual_seed(1)
    prompts = [torch.randint(3, 300, (n,)).tolist() for n in PROMPT_LENGTHS]
    results = run_engine(path, prompts, budget, backend)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for prompt, generated, ours in results:
        assert len(generated) == DECODE_STEPS
        full = torch.tensor([prompt + generated[:-1]])
        with torch.no_grad():
            theirs = reference(full).logits[0, len(prompt) - 1 :]  # [steps, vocab]
        diff = (ours - theirs).abs().max().item()
        assert diff <= 1e-4, f"{family}: max abs logit diff {diff}"
