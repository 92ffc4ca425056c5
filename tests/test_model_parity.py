"""Our decoder's logits equal transformers' on tiny random checkpoints of both families (fp32)."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from specscale.config import EngineConfig
from specscale.engine.engine import Engine
from specscale.seam import SamplingParams

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

    def capture(seqs, logits):
        for seq, logit_row in zip(seqs, logits, strict=True):
            recorded.setdefault(seq.seq_id, []).append(logit_row.to("cpu", copy=True))
        return original(seqs, logits)

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


def prefill_logits(path, tokens, dtype):
    engine = Engine(EngineConfig(model=str(path), dtype=dtype, num_kv_blocks=32, block_size=4))
    seq_id = engine.add(tokens, None, readout_positions=list(range(len(tokens))))
    outputs = []
    while engine.has_work():
        outputs += engine.step()
    assert engine.abort(seq_id) and engine.block_manager.num_used_blocks == 0
    return outputs[-1].readouts.float().cpu()


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path, qwen2_dir):
    from checkpoints import build_checkpoint

    sharded = build_checkpoint(tmp_path / "sharded", "qwen2", max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    tokens = list(range(3, 40))
    assert torch.equal(prefill_logits(sharded, tokens, "float32"), prefill_logits(qwen2_dir, tokens, "float32"))


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_bfloat16_matches_transformers_bfloat16(family, request, test_device):
    path = request.getfixturevalue(f"{family}_dir")
    tokens = list(range(3, 40))
    ours = prefill_logits(path, tokens, "bfloat16")
    logits = {}
    for dtype in (torch.bfloat16, torch.float32):
        reference = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(test_device).eval()
        with torch.no_grad():  # bf16 kernels differ across devices: compare with transformers on ours
            logits[dtype] = reference(torch.tensor([tokens], device=test_device)).logits[0].float().cpu()
    theirs, exact = logits[torch.bfloat16], logits[torch.float32]
    ulp = 2.0 ** (math.floor(math.log2(theirs.abs().max().item())) - 7)  # bf16 spacing at the largest logit
    assert (ours - theirs).abs().max().item() <= 2 * ulp  # the logits are bf16: one rounding apart at most
    # and no less accurate than transformers' own bf16 against its fp32 forward
    assert (ours - exact).abs().max().item() <= 1.25 * (theirs - exact).abs().max().item() + ulp / 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_linears_hold_one_copy_on_their_path(qwen2_dir, dtype):
    """On CPU every linear runs one of the paths it can (model/kernel_choice.py) and holds only that path's
    weight: the packed one for ours / oneDNN, the plain one for F.linear (exactness: test_kernel_choice.py,
    test_bf16_linear.py; the parity tests above cover whole models)."""
    from specscale.model.linear import Linear
    from specscale.model.loader import load_model

    model = load_model(qwen2_dir, dtype=str(dtype).removeprefix("torch."))
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears and all(m.path in ("ours", "onednn", "transposed", "torch") for m in linears)
    assert all((m.packed_bf16 is not None) == (m.path == "ours") for m in linears)
    assert all((m.packed is not None) == (m.path == "onednn") for m in linears)
    assert all((m.weight is None) == (m.path != "torch") for m in linears)
    assert any(m.bias is not None for m in linears)  # qkv carries Qwen2's bias through the packed call
    assert model.lm_head.path in ("ours", "transposed", "torch")  # tied: the embedding lookups read the head's one copy


YARN = {"factor": 4.0, "original_max_position_embeddings": 64}


@pytest.fixture(scope="module", params=["rope_parameters", "model_card_rope_scaling"])
def yarn_dir(request, tmp_path_factory):
    """A Qwen2 checkpoint with YaRN x4 over a 64-token original context, in transformers 5's dialect
    (rope_parameters, max_position_embeddings 256) or the Qwen2.5 model cards' (rope_scaling with "type",
    max_position_embeddings left at the original 64)."""
    import json

    from checkpoints import build_checkpoint

    path = build_checkpoint(tmp_path_factory.mktemp("yarn"), "qwen2", max_position_embeddings=256,
                            rope_scaling={"rope_type": "yarn", **YARN})
    if request.param == "model_card_rope_scaling":
        config = json.loads((path / "config.json").read_text())
        config.pop("rope_parameters", None)
        config.update(max_position_embeddings=64, rope_theta=10000.0, rope_scaling={"type": "yarn", **YARN})
        (path / "config.json").write_text(json.dumps(config))
    return path


def test_yarn_logits_match_transformers_past_the_original_context(yarn_dir):
    from specscale.model.loader import load_model

    assert load_model(yarn_dir, dtype="float32").args.max_position_embeddings == 256  # 64 x 4
    torch.manual_seed(2)
    prompts = [torch.randint(3, 300, (n,)).tolist() for n in (200, 90, 5)]  # 200 + 20 decoded: well past 64
    results = run_engine(yarn_dir, prompts, 512, "auto")
    reference = AutoModelForCausalLM.from_pretrained(yarn_dir, dtype=torch.float32).eval()
    assert reference.model.rotary_emb.attention_scaling > 1.0  # transformers applies YaRN too
    for prompt, generated, ours in results:
        full = torch.tensor([prompt + generated[:-1]])
        with torch.no_grad():
            theirs = reference(full).logits[0, len(prompt) - 1 :]  # [steps, vocab]
        assert (ours - theirs).abs().max().item() <= 1e-4


def test_yarn_changes_the_logits_past_the_original_context(yarn_dir, qwen2_dir):
    """Without the scaling the same weights give other logits there (the parity test is not vacuous)."""
    import json
    import shutil

    plain = yarn_dir.parent / f"{yarn_dir.name}-plain"
    shutil.copytree(yarn_dir, plain, dirs_exist_ok=True)
    config = json.loads((plain / "config.json").read_text())
    config.pop("rope_scaling", None)
    config.update(max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    (plain / "config.json").write_text(json.dumps(config))
    tokens = list(range(3, 110))  # 107 tokens: past the original 64, within prefill_logits' 128-token pool
    difference = (prefill_logits(plain, tokens, "float32") - prefill_logits(yarn_dir, tokens, "float32")).abs().max()
    assert difference > 10 * 1e-4  # ten times the parity tolerance above


def test_unknown_rope_scaling_is_refused(tmp_path):
    from specscale.model.transformer import ModelArgs, rope_inverse_frequencies

    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 10, "hidden_size": 8,
              "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
              "rope_scaling": {"rope_type": "longrope", "factor": 2.0}}
    with pytest.raises(ValueError, match="unsupported rope_scaling type 'longrope'"):
        rope_inverse_frequencies(ModelArgs.from_hf_config(config))
