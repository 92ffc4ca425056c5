"""benchmarks/random_checkpoint.py's PRM shapes and benchmarks/prm_throughput.py: a PRM checkpoint the builder
writes (a tiny shape here; the benchmark's 0.5b-prm is the same code at the Qwen2.5-0.5B sizes) loads in our
engine and scores like the transformers reference, and the benchmark's pure helpers."""

import argparse
import json
import sys
from itertools import pairwise
from pathlib import Path

import pytest
import torch

from specscale.prompts import PRM_STEP_TAG
from specscale.tokenizer import Tokenizer
from specscale.verify.hf_prm import Qwen2ForProcessRewardModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import prm_search  # noqa: E402
import prm_throughput  # noqa: E402
import random_checkpoint  # noqa: E402

TINY_PRM = random_checkpoint.Shape(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, tied=False, prm=True)


@pytest.fixture(scope="module")
def tiny_prm_dir(tmp_path_factory) -> Path:
    return random_checkpoint.write_checkpoint(tmp_path_factory.mktemp("prm") / "tiny-prm", TINY_PRM)


def test_the_0_5b_prm_shape_is_the_untied_0_5b_body_with_the_math_prm_head():
    prm, body = random_checkpoint.SHAPES["0.5b-prm"], random_checkpoint.SHAPES["0.5b"]
    assert (prm.hidden, prm.intermediate, prm.layers, prm.heads, prm.kv_heads) == (
        body.hidden, body.intermediate, body.layers, body.heads, body.kv_heads)
    assert prm.prm and not prm.tied
    config = random_checkpoint._config(prm)
    assert config["architectures"] == ["Qwen2ForProcessRewardModel"] and config["tie_word_embeddings"] is False
    # the head is Linear(h, h) + Linear(h, 2), not a vocabulary-sized LM head
    assert prm.linear_parameters - body.linear_parameters == 896 * 896 + 2 * 896 - 896 * random_checkpoint.VOCAB


def test_a_written_prm_checkpoint_has_the_score_head_and_the_step_tag(tiny_prm_dir):
    index = json.loads((tiny_prm_dir / "model.safetensors.index.json").read_text())["weight_map"]
    assert {"score.0.weight", "score.0.bias", "score.2.weight", "score.2.bias"} <= set(index)
    assert not any(name.startswith("lm_head") for name in index)
    assert Tokenizer(str(tiny_prm_dir)).token_to_id(PRM_STEP_TAG) == 151651


def test_our_engine_scores_the_written_prm_like_transformers(tiny_prm_dir):
    tag = 151651
    inputs = prm_throughput.random_inputs(prm_throughput.Point(3, 40), 16, tag, random_checkpoint.VOCAB)
    engine = prm_throughput.build_engine(str(tiny_prm_dir), "float32", kv_gb=0.05)
    elapsed, scores = prm_throughput.score_ours(engine, inputs, tag)
    assert elapsed > 0 and engine.block_manager.num_used_blocks == 0  # every sequence released afterwards
    reference = Qwen2ForProcessRewardModel.from_pretrained(str(tiny_prm_dir), dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = reference(input_ids=torch.tensor(inputs))[0]  # [inputs, tokens, 2]
    for row, ids in enumerate(inputs):
        positions = prm_throughput.tag_positions(ids, tag)
        assert positions == [15, 31, 39]
        expected = torch.softmax(logits[row, positions], dim=-1)[:, 1]  # [steps]
        assert scores[row] == pytest.approx(expected.tolist(), abs=1e-5)


def test_points_parse_and_random_inputs_put_the_tag_only_at_step_ends():
    point = prm_throughput.parse_point("32x256")
    assert (point.inputs, point.tokens, point.label, point.total_tokens) == (32, 256, "32x256", 8192)
    for bad in ("32", "0x256", "ax256", "32x"):
        with pytest.raises(argparse.ArgumentTypeError):
            prm_throughput.parse_point(bad)
    inputs = prm_throughput.random_inputs(prm_throughput.Point(4, 100), 32, 151651, random_checkpoint.VOCAB)
    assert len(inputs) == 4 and {len(ids) for ids in inputs} == {100}
    assert all(prm_throughput.tag_positions(ids, 151651) == [31, 63, 95, 99] for ids in inputs)
    ordinary = [t for ids in inputs for t in ids if t != 151651]
    assert min(ordinary) >= 10 and max(ordinary) < prm_throughput.FIRST_SPECIAL_ID
    assert inputs == prm_throughput.random_inputs(prm_throughput.Point(4, 100), 32, 151651, random_checkpoint.VOCAB)
    assert inputs[0] != inputs[1]


def test_score_comparison_helpers():
    ours = [[0.5, 0.6], [0.7]]
    assert prm_throughput.max_score_gap(ours, [[0.5, 0.61], [0.68]]) == pytest.approx(0.02)
    assert prm_throughput.max_score_gap(ours, [[0.5], [0.7, 0.1]]) is None  # a different readout layout
    assert prm_throughput.score_correlation(ours, [[0.1, 0.2], [0.3]]) == pytest.approx(1.0)
    assert prm_throughput.score_correlation(ours, [[0.3, 0.2], [0.1]]) == pytest.approx(-1.0)
    assert prm_throughput.score_correlation([[0.5, 0.5]], [[0.1, 0.2]]) is None


def test_the_table_compares_medians_and_says_when_vllm_is_missing():
    point = prm_throughput.Point(2, 100)
    ours = {"seconds": {"2x100": [1.0, 0.5, 0.4]}, "scores": {"2x100": [[0.5, 0.6], [0.7]]}}
    vllm = {"seconds": {"2x100": [1.0, 2.0, 4.0]}, "scores": {"2x100": [[0.5, 0.6], [0.71]]}}
    shape = random_checkpoint.SHAPES["0.5b-prm"]
    row = prm_throughput.table([point], ours, vllm, shape).splitlines()[2]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[:5] == ["2 × 100", "3", "400", "100", "4.00×"]  # 200 tokens / 0.5 s against / 2 s
    assert cells[6] == "0.0100"
    assert "agree" in prm_throughput.score_check([point.label], ours, vllm)
    vllm["scores"]["2x100"] = [[0.9, 0.1], [0.2]]
    assert "DISAGREE" in prm_throughput.score_check([point.label], ours, vllm)
    alone = prm_throughput.table([point], ours, None, shape).splitlines()[2]
    assert alone.count("—") == 4
    assert "not measured" in prm_throughput.score_check([point.label], ours, None)


def test_search_rounds_grow_paths_as_a_beam_search_does():
    rounds = prm_search.search_rounds(prm_search.parse_search("8x3"), 1000, seed=0)
    assert [len(paths) for paths in rounds] == [8, 8, 8]
    assert len({path.question for paths in rounds for path in paths}) == 1
    for number, paths in enumerate(rounds):
        assert all(len(path.steps) == number + 1 for path in paths)
    for previous, paths in pairwise(rounds):  # 2 kept parents, 4 children each, each with a new step
        assert [path.steps[:-1] for path in paths] == [previous[0].steps] * 4 + [previous[1].steps] * 4
        assert len({path.steps[-1] for path in paths}) == 8
    assert rounds[0][0].question != prm_search.search_rounds(prm_search.SearchPoint(8, 3), 1000, seed=1)[0][0].question
    with pytest.raises(argparse.ArgumentTypeError):
        prm_search.parse_search("6x3")  # not a multiple of the beam width


def test_a_search_scored_through_the_step_cache_matches_scoring_every_input_whole(tiny_prm_dir):
    verifier = prm_search.build_verifier(str(tiny_prm_dir), "float32", kv_gb=0.05)
    rounds = prm_search.search_rounds(prm_search.SearchPoint(4, 3), 1000, seed=0)
    elapsed, scores, computed = prm_search.score_search(verifier, rounds)
    ids = prm_search.search_ids(verifier.format, rounds)
    total = sum(len(x) for batch in ids for x in batch)
    assert elapsed > 0 and computed < total / 2  # later rounds run only the new steps
    engine = prm_throughput.build_engine(str(tiny_prm_dir), "float32", kv_gb=0.05)
    tag = Tokenizer(str(tiny_prm_dir)).token_to_id(PRM_STEP_TAG)
    whole = [s for batch in ids for s in prm_throughput.score_ours(engine, batch, tag)[1]]
    assert [len(s) for s in scores] == [len(s) for s in whole] == [1] * 4 + [2] * 4 + [3] * 4
    assert prm_throughput.max_score_gap(scores, whole) < 1e-5
    verifier.clear()
    assert verifier.kv_usage.used_blocks == 0


def test_vllm_cells_take_the_faster_mode_and_the_note_gives_both():
    from types import SimpleNamespace

    from engine_throughput import best_of_modes, table, vllm_modes_note

    by_mode = {"compile": {"vllm-cpu|bfloat16|32": [200, 217, 990], "vllm-cpu|bfloat16|64": [362, 360, 370]},
               "eager": {"vllm-cpu|bfloat16|32": [300, 315, 320], "vllm-cpu|bfloat16|64": [347, 340, 350]}}
    results = best_of_modes(by_mode)
    assert results["vllm-cpu|bfloat16|32"] == [300, 315, 320]  # by median, not by the best single repeat
    assert results["vllm-cpu|bfloat16|64"] == [362, 360, 370]
    args = SimpleNamespace(vllm_modes=["compile", "eager"], dtypes=["bfloat16"], batch_sizes=[32, 64])
    results.update({"specscale|bfloat16|32": [630.0], "specscale|bfloat16|64": [724.0]})
    rows = table(results, args).splitlines()
    assert rows[2].split("|")[2:4] == [" 630 ", " 315 "] and "2.00×" in rows[2] and "2.00×" in rows[3]
    assert "batch 32: compile 217 / eager 315" in vllm_modes_note(results, args)


def test_rounds_merge_every_repeat_and_the_note_gives_each_rounds_speedup():
    from types import SimpleNamespace

    from engine_throughput import merge_rounds, rounds_note

    first = {"specscale|bfloat16|32": [600.0, 620.0], "vllm-cpu[compile]|bfloat16|32": [300.0, 310.0],
             "vllm-cpu[eager]|bfloat16|32": [400.0, 410.0], "vllm-cpu|bfloat16|32": [400.0, 410.0]}
    second = {"specscale|bfloat16|32": [500.0, 520.0], "vllm-cpu[compile]|bfloat16|32": [500.0, 500.0],
              "vllm-cpu[eager]|bfloat16|32": [200.0, 210.0], "vllm-cpu|bfloat16|32": [500.0, 500.0]}
    merged = merge_rounds([first, second])
    assert merged["specscale|bfloat16|32"] == [600.0, 620.0, 500.0, 520.0]
    # the better mode over all rounds by median (compile 300-500 against eager 200-410), not per round
    assert merged["vllm-cpu|bfloat16|32"] == [300.0, 310.0, 500.0, 500.0]
    args = SimpleNamespace(dtypes=["bfloat16"], batch_sizes=[32])
    assert rounds_note([first, second], args).endswith("bfloat16 batch 32 vs vLLM-CPU 1.51× / 1.02×.\n")
    assert rounds_note([first], args) == ""
