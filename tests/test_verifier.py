"""PRM verifier: both formats against a plain transformers reference, token-exact step pieces, prefix
reuse counted in computed tokens, forked paths sharing cached prefixes, over-context paths, step
cleaning, the KV pool bounds of the cache. Every test ends with zero KV blocks in use."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from transformers import AutoTokenizer, LlamaForCausalLM, Qwen2Config, Qwen2Model

from checkpoints import build_llama_prm_checkpoint, build_qwen_prm_checkpoint
from scripted_generator import EOS, NEWLINE, ScriptedGenerator, seeded_step
from specscale.config import EngineConfig
from specscale.prompts import PRM_STEP_TAG, PRM_SYSTEM_PROMPT
from specscale.runtime.device_properties import DeviceProperties
from specscale.runtime.runtime import SearchRequest, SearchRuntime
from specscale.seam import ScoreRequest
from specscale.search.presets import preset_config
from specscale.sim.clock import VirtualClock
from specscale.verify import QwenMathPRMFormat, RLHFlowFormat, Verifier, VerifierConfig, clean_steps
from specscale.verify.prm import boundary_keys

QUESTION = "Tom has 12 apples. He buys 7 more and gives away 5. How many apples does he have?"
STEPS = [
    "He buys 7 more: 12 + 7 = 19.\n\n",
    "Then he gives away 5: 19 - 5 = 14.\n\n",
    "Check: 14 + 5 = 19. Correct.\n\n",
    "The answer is \\boxed{14}.",
]
OTHER_STEPS = ["Solve step by step: 3 * 4 = 12.\n\n", "12 / 2 = 6, and 6 + 1 = 7.\n\n", "So \\boxed{7}."]
FAMILIES = ["qwen", "llama"]


@pytest.fixture(scope="module")
def qwen_prm_dir(tmp_path_factory):
    return build_qwen_prm_checkpoint(tmp_path_factory.mktemp("qwen_prm"))


@pytest.fixture(scope="module")
def llama_prm_dir(tmp_path_factory):
    return build_llama_prm_checkpoint(tmp_path_factory.mktemp("llama_prm"))


def prm_dir(request, family):
    return request.getfixturevalue(f"{family}_prm_dir")


def make_verifier(path, *, format=None, max_cached_prefixes=1024, min_free_block_fraction=0.25, **engine) -> Verifier:
    options = dict(model=str(path), dtype="float32", num_kv_blocks=256, block_size=8, max_num_batched_tokens=512)
    options.update(engine)
    return Verifier(VerifierConfig(EngineConfig(**options), format=format, max_cached_prefixes=max_cached_prefixes,
                                   min_free_block_fraction=min_free_block_fraction))


def release(verifier: Verifier) -> None:
    """Clear the cache: no KV block may stay in use, and the block invariants hold."""
    engine = verifier.engine
    verifier.clear()
    engine.block_manager.check_invariants(engine.scheduler.sequences.values())
    assert engine.block_manager.num_used_blocks == 0
    assert engine.num_live_sequences == 0
    verifier.close()


def scores_of(verifier, question, steps):
    (result,) = verifier.score([ScoreRequest(question, steps)])
    assert result.ok, result.error
    return result.step_scores


def cached_blocks(verifier, question, steps) -> tuple[list[int], int]:
    """Block table and length of the cached sequence holding exactly this path's input."""
    prm_input = verifier.format.encode(question, clean_steps(steps))
    num_steps, entry = verifier.cache.longest_prefix(prm_input, boundary_keys(prm_input), touch=False)
    assert num_steps == prm_input.num_steps
    return list(verifier.engine.get(entry.seq_id).block_table), entry.num_tokens


# ---- transformers references (docs/design.md's "PRM formats" formulas over the whole chat, tokenised as a whole) ---
@torch.no_grad()
def qwen_reference_scores(path, question, steps) -> list[float]:
    tokenizer = AutoTokenizer.from_pretrained(path)
    messages = [
        {"role": "system", "content": PRM_SYSTEM_PROMPT},
        {"role": "user", "content": question},
        {"role": "assistant", "content": PRM_STEP_TAG.join(steps) + PRM_STEP_TAG},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])  # [1, T]
    weights = load_file(str(path / "model.safetensors"))
    body = Qwen2Model(Qwen2Config.from_pretrained(path)).eval()
    body.load_state_dict({k.removeprefix("model."): v for k, v in weights.items() if k.startswith("model.")})
    h = body.config.hidden_size
    head = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, 2))
    head.load_state_dict({k.removeprefix("score."): v for k, v in weights.items() if k.startswith("score.")})
    probs = torch.softmax(head(body(input_ids=ids).last_hidden_state), dim=-1)  # [1, T, 2]
    mask = ids == tokenizer.convert_tokens_to_ids(PRM_STEP_TAG)  # [1, T]
    return probs[mask][:, 1].tolist()


@torch.no_grad()
def rlhflow_reference_scores(path, question, steps) -> list[float]:
    """The single-conversation recipe: after appending step k, logits[-3] predicts the assistant's '+'."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    plus = tokenizer.encode("+", add_special_tokens=False)[-1]
    minus = tokenizer.encode("-", add_special_tokens=False)[-1]
    conversation, scores = [], []
    for k, step in enumerate(steps):
        conversation.append({"role": "user", "content": f"{question} {step.strip()}" if k == 0 else step.strip()})
        conversation.append({"role": "assistant", "content": "+"})
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids[-2] == plus
        logits = model(torch.tensor([ids])).logits[0, -3]  # [vocab]
        scores.append(torch.softmax(logits[[plus, minus]], dim=-1)[0].item())
    return scores


REFERENCES = {"qwen": qwen_reference_scores, "llama": rlhflow_reference_scores}


@pytest.mark.parametrize("family", FAMILIES)
def test_scores_match_the_transformers_reference(family, request):
    path = prm_dir(request, family)
    verifier = make_verifier(path)
    paths = [(QUESTION, STEPS), ("What is 3 * 4 / 2 + 1?", OTHER_STEPS), (QUESTION, STEPS[:1])]
    results = verifier.score([ScoreRequest(q, s) for q, s in paths])
    all_scores = []
    for (question, steps), result in zip(paths, results, strict=True):
        expected = REFERENCES[family](path, question, clean_steps(steps))
        assert result.ok and result.num_steps == len(steps) and len(result.step_scores) == len(steps)
        assert max(abs(a - b) for a, b in zip(result.step_scores, expected, strict=True)) < 1e-4
        assert result.newest_score == result.step_scores[-1]
        all_scores += result.step_scores
    assert max(all_scores) - min(all_scores) > 0.02  # the scores differ: a wrong position would show
    release(verifier)


def test_qwen_scores_match_the_hf_prm_head_class(qwen_prm_dir):
    """The checkpoint's real layout loads into the transformers head class, whose scorer agrees."""
    from specscale.verify.hf_prm import Qwen2ForProcessRewardModel, score_batch

    model = Qwen2ForProcessRewardModel.from_pretrained(qwen_prm_dir, dtype=torch.float32).eval()
    paths = [(QUESTION, clean_steps(STEPS)), ("What is 3 * 4 / 2 + 1?", clean_steps(OTHER_STEPS))]
    expected = score_batch(model, AutoTokenizer.from_pretrained(qwen_prm_dir), paths)
    verifier = make_verifier(qwen_prm_dir)
    results = verifier.score([ScoreRequest(q, s) for q, s in paths])
    for result, want in zip(results, expected, strict=True):
        assert len(result.step_scores) == len(want)
        assert max(abs(a - b) for a, b in zip(result.step_scores, want, strict=True)) < 1e-4
    release(verifier)


@pytest.mark.parametrize("family", FAMILIES)
def test_format_is_chosen_from_config_json(family, request):
    verifier = make_verifier(prm_dir(request, family))
    assert isinstance(verifier.format, {"qwen": QwenMathPRMFormat, "llama": RLHFlowFormat}[family])
    release(verifier)


def test_format_override_must_match_the_head(qwen_prm_dir):
    with pytest.raises(ValueError, match="needs an LM head"):
        make_verifier(qwen_prm_dir, format="rlhflow")
    with pytest.raises(ValueError, match="unknown PRM format"):
        make_verifier(qwen_prm_dir, format="nope")


def test_a_template_that_is_not_prefix_stable_is_refused(llama_prm_dir, tmp_path):
    import json
    import shutil

    folder = tmp_path / "counting_template"
    shutil.copytree(llama_prm_dir, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ messages | length }} turns:" + config["chat_template"]  # the head changes
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="chat template"):
        make_verifier(folder)


step_text = st.text(st.characters(codec="utf-8", exclude_characters="<>"), min_size=1, max_size=30)


@pytest.mark.parametrize("family", FAMILIES)
def test_step_pieces_tokenize_like_the_whole_chat(family, request):
    verifier = make_verifier(prm_dir(request, family))
    fmt, tokenizer = verifier.format, verifier.engine.tokenizer

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(question=step_text, steps=st.lists(step_text, min_size=1, max_size=5))
    def check(question, steps):
        steps = clean_steps(steps)
        if not steps:
            return
        encoded = fmt.encode(question, steps)
        whole = fmt.render(question, steps)
        assert list(encoded.token_ids) == tokenizer.encode(whole)[: len(encoded.token_ids)]
        for j in range(1, len(steps)):  # the input for steps[:j] is a token-exact prefix
            shorter = fmt.encode(question, steps[:j])
            assert shorter.token_ids == encoded.token_ids[: encoded.step_ends[j - 1]]
            assert shorter.score_positions == encoded.score_positions[:j]

    check()
    release(verifier)


@pytest.mark.parametrize("family", FAMILIES)
def test_scoring_step_k_computes_only_its_new_tokens(family, request):
    path = prm_dir(request, family)
    verifier = make_verifier(path)
    fmt = verifier.format
    steps = clean_steps(STEPS)
    template_tails = set()  # tokens computed beyond the step's own text, per step k > 1
    for k in range(1, len(steps) + 1):
        request_k = ScoreRequest(QUESTION, STEPS[:k])
        new_tokens = len(fmt.encode(QUESTION, steps[:k]).token_ids) - (
            len(fmt.encode(QUESTION, steps[: k - 1]).token_ids) if k > 1 else 0)
        assert verifier.tokens_to_compute(request_k) == new_tokens
        (result,) = verifier.score([request_k])
        assert result.computed_tokens == new_tokens  # step k's tokens and its template tail only
        if k > 1:
            template_tails.add(new_tokens - len(verifier.engine.tokenizer.encode(steps[k - 1])))
        assert verifier.tokens_to_compute(request_k) == 0  # now fully cached
    (tail,) = template_tails  # the same separator / template tail for every step: no history recomputed
    assert 1 <= tail <= 24
    cold = make_verifier(path)
    expected = scores_of(cold, QUESTION, STEPS)
    assert max(abs(a - b) for a, b in zip(result.step_scores, expected, strict=True)) < 1e-5  # reuse changes nothing
    assert verifier.stats.computed_tokens == len(fmt.encode(QUESTION, steps).token_ids)
    (again,) = verifier.score([ScoreRequest(QUESTION, STEPS)])  # rescoring a scored path is free
    assert again.computed_tokens == 0 and again.step_scores == result.step_scores
    release(verifier)
    release(cold)


@pytest.mark.parametrize("family", FAMILIES)
def test_fresh_path_over_the_engines_prefix_cache_gets_every_score(family, request):
    """After clear() the KV blocks keep their hashes: a fresh add of the same path finds them in the
    engine's prefix cache, which must not skip the readouts of its early steps."""
    verifier = make_verifier(prm_dir(request, family))
    first = scores_of(verifier, QUESTION, STEPS)
    verifier.clear()
    (again,) = verifier.score([ScoreRequest(QUESTION, STEPS)])
    assert again.ok and len(again.step_scores) == len(first)
    assert max(abs(a - b) for a, b in zip(again.step_scores, first, strict=True)) < 1e-5
    assert verifier.engine.block_manager.num_cache_hit_tokens > 0  # the engine's prefix cache was used
    assert again.computed_tokens < len(verifier.format.encode(QUESTION, clean_steps(STEPS)).token_ids)
    release(verifier)


@pytest.mark.parametrize("family", FAMILIES)
def test_many_paths_in_one_batch_share_cached_prefixes(family, request):
    path = prm_dir(request, family)
    verifier = make_verifier(path)
    fmt = verifier.format
    parents = [(QUESTION, STEPS[:2]), ("What is 3 * 4 / 2 + 1?", OTHER_STEPS[:2])]
    verifier.score([ScoreRequest(q, s) for q, s in parents])
    endings = ["So 19 - 5 = 14.", "So 19 - 5 = 13.", "Check: 14 + 5 = 19.", "The answer is \\boxed{14}."]
    children = [(q, s + [end]) for q, s in parents for end in endings]
    fresh = [("A fresh question: 12 + 7?", ["12 + 7 = 19."])]
    batch = children + [children[0]] + fresh  # one duplicate of a child
    computed_before = verifier.stats.computed_tokens
    results = verifier.score([ScoreRequest(q, s) for q, s in batch])
    for (question, steps), result in zip(children, results[:len(children)], strict=True):
        parent_len = len(fmt.encode(question, clean_steps(steps[:2])).token_ids)
        child_len = len(fmt.encode(question, clean_steps(steps)).token_ids)
        assert result.ok and result.computed_tokens == child_len - parent_len
    assert results[len(children)].computed_tokens == 0  # the duplicate was computed once
    assert results[len(children)].step_scores == results[0].step_scores
    assert verifier.stats.computed_tokens - computed_before == sum(r.computed_tokens for r in results)
    assert verifier.stats.waves == 2  # the parents' batch and this one: one engine run each
    # Each child's paused sequence holds its parent's full KV blocks themselves (shared, not copied).
    for question, steps in children:
        parent_table, parent_len = cached_blocks(verifier, question, steps[:2])
        child_table, _ = cached_blocks(verifier, question, steps)
        assert child_table[: parent_len // 8] == parent_table[: parent_len // 8]
    cold = make_verifier(path)
    for (question, steps), result in zip(batch, results, strict=True):
        expected = scores_of(cold, question, steps)
        assert max(abs(a - b) for a, b in zip(result.step_scores, expected, strict=True)) < 1e-5
    release(verifier)
    release(cold)


@pytest.mark.parametrize("family", FAMILIES)
def test_fresh_paths_of_one_question_in_one_batch_compute_the_question_once(family, request):
    """A search's first round: N fresh paths of one question. The first runs alone, the others then find the
    question's full KV blocks in the engine's prefix cache; the scores are those of paths scored alone."""
    path = prm_dir(request, family)
    verifier = make_verifier(path)
    endings = ["So 19 - 5 = 14.", "So 19 - 5 = 13.", "Check: 14 + 5 = 19.", "The answer is \\boxed{14}."]
    batch = [(QUESTION, [end]) for end in endings] + [("What is 3 * 4 / 2 + 1?", OTHER_STEPS[:1])]
    results = verifier.score([ScoreRequest(q, s) for q, s in batch])
    lengths = [len(verifier.format.encode(q, clean_steps(s)).token_ids) for q, s in batch]
    assert results[0].computed_tokens == lengths[0] and results[-1].computed_tokens == lengths[-1]
    shared = verifier.engine.block_manager.num_cache_hit_tokens
    assert shared >= 3 * 8  # each later path of the question reused at least one full 8-token block
    assert all(r.computed_tokens < n for r, n in zip(results[1:4], lengths[1:4], strict=True))
    assert verifier.stats.computed_tokens == sum(lengths) - shared
    assert verifier.stats.waves == 2  # the first pass (one path per question), then the others
    cold = make_verifier(path)
    for (question, steps), result in zip(batch, results, strict=True):
        expected = scores_of(cold, question, steps)
        assert result.ok and max(abs(a - b) for a, b in zip(result.step_scores, expected, strict=True)) < 1e-5
    release(verifier)
    release(cold)


@pytest.mark.parametrize("family", FAMILIES)
def test_over_context_path_gets_an_error_and_the_batch_is_scored(family, request):
    path = prm_dir(request, family)
    fmt_probe = make_verifier(path)
    encoded = fmt_probe.format.encode(QUESTION, clean_steps(STEPS))
    release(fmt_probe)
    limit = encoded.step_ends[1] + 1  # room for two of the four steps
    verifier = make_verifier(path, max_model_len=limit)
    too_long = ScoreRequest(QUESTION, STEPS)
    nothing_fits = ScoreRequest(QUESTION + " Explain." * 40, STEPS[:1])
    fine = ScoreRequest(QUESTION, STEPS[:2])
    long_result, none_result, fine_result = verifier.score([too_long, nothing_fits, fine])
    assert not long_result.ok and "context" in long_result.error and long_result.num_steps == 4
    assert len(long_result.step_scores) == 2 and long_result.newest_score is None
    assert not none_result.ok and none_result.step_scores == ()
    assert fine_result.ok and len(fine_result.step_scores) == 2
    assert max(abs(a - b) for a, b in zip(long_result.step_scores, fine_result.step_scores, strict=True)) < 1e-6
    big = make_verifier(path)
    expected = scores_of(big, QUESTION, STEPS)[:2]
    assert max(abs(a - b) for a, b in zip(fine_result.step_scores, expected, strict=True)) < 1e-5
    release(verifier)
    release(big)


@pytest.mark.parametrize("family", FAMILIES)
def test_trailing_delimiters_and_empty_steps_are_not_scored(family, request):
    verifier = make_verifier(prm_dir(request, family))
    messy = ["He buys 7 more: 12 + 7 = 19.\n\n", "\n\n", "", "Then 19 - 5 = 14.\n\n", "  \n\n"]
    clean = ["He buys 7 more: 12 + 7 = 19.", "Then 19 - 5 = 14."]
    assert clean_steps(messy) == clean
    messy_result, clean_result, empty_result = verifier.score(
        [ScoreRequest(QUESTION, messy), ScoreRequest(QUESTION, clean), ScoreRequest(QUESTION, ["\n\n", ""])])
    assert messy_result.num_steps == 2 and len(messy_result.step_scores) == 2
    assert messy_result.step_scores == clean_result.step_scores
    assert messy_result.computed_tokens + clean_result.computed_tokens == len(
        verifier.format.encode(QUESTION, clean).token_ids)  # identical inputs: computed once
    assert not empty_result.ok and empty_result.step_scores == () and empty_result.num_steps == 0
    release(verifier)


def test_small_kv_pool_scores_in_waves_and_keeps_blocks_free(qwen_prm_dir):
    batch = [ScoreRequest(f"Question {i}: {QUESTION}", STEPS[: 1 + i % 4]) for i in range(12)]
    roomy = make_verifier(qwen_prm_dir, num_kv_blocks=512)
    expected = [r.step_scores for r in roomy.score(batch)]
    assert roomy.stats.waves == 1
    release(roomy)
    tight = make_verifier(qwen_prm_dir, num_kv_blocks=48, max_cached_prefixes=5, min_free_block_fraction=0.5)
    results = tight.score(batch)
    assert tight.stats.waves > 1  # the pool could not hold the batch at once
    for result, want in zip(results, expected, strict=True):
        assert result.ok and max(abs(a - b) for a, b in zip(result.step_scores, want, strict=True)) < 1e-5
    assert len(tight.cache) <= 5
    assert tight.engine.block_manager.num_free_blocks >= 24
    release(tight)


def test_a_path_larger_than_the_kv_pool_gets_an_error(qwen_prm_dir):
    verifier = make_verifier(qwen_prm_dir, num_kv_blocks=16)  # 128 tokens of KV
    assert len(verifier.format.encode(QUESTION, clean_steps(STEPS)).token_ids) > 128
    assert len(verifier.format.encode("2+2?", ["4"]).token_ids) <= 128
    long_path, short_path = verifier.score([ScoreRequest(QUESTION, STEPS), ScoreRequest("2+2?", ["4"])])
    assert not long_path.ok and "KV pool" in long_path.error and long_path.step_scores == ()
    assert short_path.ok and len(short_path.step_scores) == 1
    release(verifier)


def test_bfloat16_scores_are_close_to_float32(qwen_prm_dir):
    fp32, bf16 = make_verifier(qwen_prm_dir), make_verifier(qwen_prm_dir, dtype="bfloat16")
    a, b = scores_of(fp32, QUESTION, STEPS), scores_of(bf16, QUESTION, STEPS)
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 0.05
    release(fp32)
    release(bf16)


def test_closed_verifier_refuses_work(qwen_prm_dir):
    verifier = make_verifier(qwen_prm_dir)
    engine = verifier.engine
    scores_of(verifier, QUESTION, STEPS)
    assert engine.block_manager.num_used_blocks > 0  # the path is cached
    verifier.close()
    assert engine.block_manager.num_used_blocks == 0
    with pytest.raises(RuntimeError, match="closed"):
        verifier.score([ScoreRequest(QUESTION, STEPS)])


def three_step_solution(prefix: tuple, seed: int, final: bool) -> list[int]:
    """A whole solution in one generation: three lettered steps joined by "\\n\\n", then EOS."""
    step = seeded_step(prefix, seed, final=True)[:-1]  # letters only
    return step + [NEWLINE, NEWLINE] + step[::-1] + [NEWLINE, NEWLINE] + step[:2] + [EOS]


@pytest.mark.parametrize("family", FAMILIES)
def test_best_of_n_scores_every_step_of_a_whole_solution(family, request):
    """search-and-learn splits a sampled solution on "\\n\\n" and scores each piece; the old verifier scored
    best-of-N's whole text (and beam search's final round) as one step."""
    verifier = make_verifier(prm_dir(request, family))
    clock = VirtualClock()
    runtime = SearchRuntime(ScriptedGenerator(clock, three_step_solution), verifier, DeviceProperties(2048, None),
                            clock=clock)
    config = preset_config("best-of-n", beam_size=2, beam_width=2, seed=5)
    result = runtime.run([SearchRequest(QUESTION, [1, 2, 3], config)])[0]
    assert result.paths
    for path in result.paths:
        pieces = path.text.split("\n\n")
        assert len(path.steps) == 1 and len(pieces) == 3
        assert len(path.step_scores) == 3
        separate = verifier.score([ScoreRequest(QUESTION, pieces)])[0]
        assert path.step_scores == pytest.approx(separate.step_scores)
    release(verifier)
