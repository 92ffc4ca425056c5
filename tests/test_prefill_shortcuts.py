"""The prefill shortcuts change no result: the MLP in chunks (model/transformer.py, MLP_CHUNK_ROWS) and the
last layer run only on the rows a head reads (DecoderModel's output_rows) give bit-identical outputs on the
packed linear paths (ours, oneDNN), which compute a row the same way in any batch of >= 7 rows; F.linear
(kernels "torch", which the kernel choice may pick for a small weight) may round a row differently by batch."""

import pytest
import torch

from specscale.config import EngineConfig
from specscale.engine.engine import Engine
from specscale.model import transformer
from specscale.model.loader import load_model
from specscale.model.transformer import equal_chunks
from tests.checkpoints import build_qwen_prm_checkpoint


@pytest.mark.parametrize("rows,most", [(513, 512), (1024, 512), (1000, 256), (7, 512), (2049, 1024)])
def test_equal_chunks_cover_every_row_once_within_the_limit(rows, most):
    starts = equal_chunks(rows, most)
    sizes = [min(start + starts.step, rows) - start for start in starts]
    assert sum(sizes) == rows and max(sizes) <= most
    assert len(sizes) == 1 or min(sizes) >= most // 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_chunked_mlp_is_bit_identical_to_one_pass(qwen2_dir, dtype, monkeypatch):
    model = load_model(str(qwen2_dir), dtype, "cpu", 256, kernels="onednn")
    mlp = model.model.layers[0].mlp
    x = torch.randn(301, model.args.hidden_size).to(getattr(torch, dtype))  # [T, h]
    with torch.inference_mode():
        whole = mlp(x, fused=False)
        monkeypatch.setattr(transformer, "MLP_CHUNK_ROWS", 64)  # 5 chunks of 61 / 60 rows
        chunked = mlp(x, fused=False)
    assert torch.equal(chunked, whole)


def readouts(model_dir, inputs, backend, drop_rows: bool, monkeypatch):
    """Head outputs at every 8th position of each input, with or without the last layer's row dropping."""
    if not drop_rows:
        original = transformer.DecoderModel.forward

        def every_row(self, input_ids, rope, kv_caches, meta, output_rows=None):
            hidden = original(self, input_ids, rope, kv_caches, meta, None)
            return hidden if output_rows is None else hidden.index_select(0, output_rows)

        monkeypatch.setattr(transformer.DecoderModel, "forward", every_row)
    engine = Engine(EngineConfig(model=str(model_dir), dtype="float32", num_kv_blocks=128, block_size=4,
                                 max_num_batched_tokens=96, attention_backend=backend, kernels="onednn"))
    last_mlp_rows = []
    engine.runner.model.model.layers[-1].mlp.register_forward_hook(lambda m, args, out: last_mlp_rows.append(len(out)))
    ids = [engine.add(tokens, None, readout_positions=list(range(7, len(tokens), 8))) for tokens in inputs]
    results = {}
    while len(results) < len(ids):
        for out in engine.step():
            if out.readouts is not None:
                results[out.seq_id] = out.readouts
    monkeypatch.undo()
    for seq_id in ids:  # a readout sequence keeps its blocks until released (the verifier's prefix cache)
        engine.abort(seq_id)
    assert engine.block_manager.num_used_blocks == 0
    tokens, heads = sum(map(len, inputs)), sum(len(results[i]) for i in ids)
    assert sum(last_mlp_rows) == (heads if drop_rows else tokens)  # the last MLP ran on the head rows only
    return [results[i] for i in ids]


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_last_layer_on_head_rows_only_changes_no_score(tmp_path, backend, monkeypatch):
    model_dir = build_qwen_prm_checkpoint(tmp_path / "prm")
    torch.manual_seed(0)
    inputs = [torch.randint(3, 250, (n,)).tolist() for n in (70, 33, 121, 16)]  # chunked over 96-token steps
    dropped = readouts(model_dir, inputs, backend, True, monkeypatch)
    kept = readouts(model_dir, inputs, backend, False, monkeypatch)
    for ours, reference in zip(dropped, kept, strict=True):
        assert ours.shape[0] > 0 and torch.equal(ours, reference)
