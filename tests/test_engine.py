"""Engine API: stops, pause/extend without recompute, fork + copy-on-write, prefix cache, preemption,
priorities, abort, multi-draw splits, readouts, usage counters and input errors."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine_helpers import ScriptedSampler, check_blocks, generated, make_engine, run_until_idle
from specscale.engine.sequence import FinishReason, SequenceStatus
from specscale.seam import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True)
PROMPT = [5, 17, 42, 99, 120, 7, 8, 9, 10, 11, 250]


@pytest.fixture
def engine(qwen2_dir):
    eng = make_engine(qwen2_dir)
    yield eng
    for seq_id in list(eng.scheduler.sequences):
        eng.abort(seq_id)
    assert eng.block_manager.num_used_blocks == 0
    check_blocks(eng)


def test_stop_string_across_tokens_pauses_then_extend_computes_only_new_tokens(engine):
    tok = engine.tokenizer
    (newline,) = tok.encode("\n")
    step_one = tok.encode("12 + 7 = 19.") + [newline, newline]  # the stop string spans two tokens
    step_two = tok.encode("Then 5.") + [newline, newline]
    engine.sampler = ScriptedSampler(step_one + step_two)
    params = SamplingParams(temperature=0.8, stop=("\n\n",), max_new_tokens=50)
    seq_id = engine.add(PROMPT, params)
    outputs = run_until_idle(engine)
    seq = engine.get(seq_id)
    assert generated(outputs, seq_id) == step_one
    assert outputs[seq_id][-1].status == SequenceStatus.PAUSED
    assert outputs[seq_id][-1].finish_reason == FinishReason.STOP
    assert seq.usage.computed_tokens == len(PROMPT) + len(step_one) - 1  # the last token has no KV yet
    blocks_before = list(seq.block_table)
    engine.extend(seq_id)
    outputs = run_until_idle(engine)
    assert generated(outputs, seq_id) == step_two
    assert seq.block_table[: len(blocks_before) - 1] == blocks_before[:-1]  # prefix KV kept in place
    assert seq.usage.computed_tokens == len(PROMPT) + len(step_one) + len(step_two) - 1  # no recompute
    assert seq.usage.generated_tokens == len(step_one) + len(step_two)
    assert seq.usage.prompt_tokens == len(PROMPT)


def test_stop_string_inside_a_token_sequence(engine):
    tok = engine.tokenizer
    script = tok.encode("3 * 4 = 12, 12 / 2 = 6")
    engine.sampler = ScriptedSampler(script)
    seq_id = engine.add(PROMPT, SamplingParams(stop=("= 12,",), max_new_tokens=50))
    outputs = run_until_idle(engine)
    text = tok.decode(generated(outputs, seq_id))
    assert text.endswith("= 12,") and outputs[seq_id][-1].finish_reason == FinishReason.STOP


def test_eos_length_and_context_finish_and_free(qwen2_dir):
    engine = make_engine(qwen2_dir, max_model_len=20)
    eos = next(iter(engine.eos_token_ids))
    engine.sampler = ScriptedSampler([7, eos] + [7] * 40)
    a = engine.add(PROMPT, SamplingParams(max_new_tokens=50))
    outputs = run_until_idle(engine)
    assert outputs[a][-1].finish_reason == FinishReason.EOS and engine.get(a) is None
    b = engine.add(PROMPT, SamplingParams(max_new_tokens=3))
    c = engine.add(PROMPT, SamplingParams(max_new_tokens=50))
    outputs = run_until_idle(engine)
    assert len(generated(outputs, b)) == 3 and outputs[b][-1].finish_reason == FinishReason.LENGTH
    assert len(PROMPT) + len(generated(outputs, c)) == 20 and outputs[c][-1].finish_reason == FinishReason.CONTEXT
    assert engine.block_manager.num_used_blocks == 0


def test_fork_shares_blocks_and_children_continue_like_fresh_sequences(engine, qwen2_dir):
    real_sampler = engine.sampler
    engine.sampler = ScriptedSampler(engine.tokenizer.encode("1 2\n"))
    parent = engine.add(PROMPT, SamplingParams(max_new_tokens=50, stop=("\n",)))
    run_until_idle(engine)
    seq = engine.get(parent)
    assert seq.status == SequenceStatus.PAUSED and seq.num_computed_tokens % 4 != 0  # partial last block
    children = engine.fork(parent, 3)
    shared = list(seq.block_table)
    assert all(engine.get(c).block_table == shared for c in children)
    assert all(engine.block_manager.ref_count[b] == 4 for b in shared)
    engine.abort(parent)
    engine.sampler = real_sampler
    for c in children:
        engine.extend(c, GREEDY)
    first = {o.seq_id: o.new_token_ids for o in engine.step()}  # each child writes its first KV:
    tables = [engine.get(c).block_table for c in children]
    assert all(t[:-1] == shared[:-1] for t in tables)  # full blocks stay shared, the partial one is copied
    assert len({t[-1] for t in tables}) == 3  # two copies; the last writer keeps the original
    outputs = run_until_idle(engine)
    texts = {tuple(first[c] + generated(outputs, c)) for c in children}
    assert len(texts) == 1  # greedy children of one prefix agree...
    fresh = make_engine(qwen2_dir)
    fresh_id = fresh.add(list(seq.token_ids), GREEDY)
    assert [generated(run_until_idle(fresh), fresh_id)] == [list(t) for t in texts]  # ...with a fresh run


def test_prefix_cache_skips_cached_blocks_and_changes_nothing(engine, qwen2_dir):
    prompt = list(range(3, 43))  # 40 tokens = 10 full blocks of 4
    first = engine.add(prompt, GREEDY)
    out_first = run_until_idle(engine)
    second = engine.add(prompt, GREEDY)
    out_second = run_until_idle(engine)
    seq_usage = engine.block_manager.num_cache_hit_tokens
    assert seq_usage >= 36  # all full prompt blocks came from the cache (one token must be computed)
    assert generated(out_first, first) == generated(out_second, second)
    cold = make_engine(qwen2_dir, enable_prefix_caching=False)
    cold_id = cold.add(prompt, GREEDY)
    assert generated(run_until_idle(cold), cold_id) == generated(out_second, second)


def test_preemption_by_recompute_loses_nothing(qwen2_dir):
    prompts = [[(7 * i + j) % 290 + 3 for j in range(10 + i)] for i in range(12)]
    big = make_engine(qwen2_dir)
    small = make_engine(qwen2_dir, num_kv_blocks=20)
    results = []
    for engine in (big, small):
        ids = [engine.add(p, GREEDY) for p in prompts]
        outputs = run_until_idle(engine)
        results.append([generated(outputs, i) for i in ids])
        assert engine.block_manager.num_used_blocks == 0
    assert small.scheduler.num_preemptions > 0
    assert results[0] == results[1]


def test_preempted_speculative_sequence_is_aborted_not_resumed(qwen2_dir):
    engine = make_engine(qwen2_dir, num_kv_blocks=12)
    low = engine.add(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=30, ignore_eos=True),
                     priority=-1, abort_on_preempt=True)
    engine.step()
    high = [engine.add(PROMPT, GREEDY) for _ in range(2)]
    outputs = run_until_idle(engine)
    assert outputs[low][-1].finish_reason == FinishReason.PREEMPTED
    assert all(len(generated(outputs, h)) == GREEDY.max_new_tokens for h in high)


def test_higher_priority_runs_first(qwen2_dir):
    engine = make_engine(qwen2_dir, max_num_seqs=1)
    low = engine.add(PROMPT, GREEDY, priority=-1)
    high = engine.add(PROMPT, GREEDY, priority=1)
    finished_order = []
    while engine.has_work():
        finished_order += [o.seq_id for o in engine.step() if o.status == SequenceStatus.FINISHED]
    assert finished_order == [high, low]


def test_abort_at_any_time_frees_blocks(engine):
    seq_id = engine.add(PROMPT, GREEDY)
    engine.step()
    engine.step()
    assert engine.block_manager.num_used_blocks > 0
    assert engine.abort(seq_id) is True
    assert engine.block_manager.num_used_blocks == 0
    assert engine.abort(seq_id) is False
    assert not engine.has_work()


def test_multiplicity_splits_into_children_that_sum_to_m(engine):
    params = SamplingParams(temperature=1.5, max_new_tokens=6, ignore_eos=True, seed=3)
    root = engine.add(PROMPT, params, multiplicity=8)
    outputs = run_until_idle(engine)
    leaves = {}
    for seq_id, outs in outputs.items():
        leaves[seq_id] = outs[-1].multiplicity
        if outs[0].parent_id is not None:
            assert outs[0].parent_id in outputs
    assert root in outputs and sum(leaves.values()) == 8
    assert len(leaves) > 1  # at temperature 1.5 over a random model the 8 draws diverge


def test_readout_sequence_returns_head_outputs_at_positions(engine, qwen2_dir):
    tokens = list(range(3, 30))
    positions = [0, 5, 17, 26]
    seq_id = engine.add(tokens, None, readout_positions=positions)
    outputs = run_until_idle(engine)
    readouts = outputs[seq_id][-1].readouts
    reference = AutoModelForCausalLM.from_pretrained(qwen2_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = reference(torch.tensor([tokens])).logits[0, positions]
    assert (readouts.cpu() - expected).abs().max() < 1e-4
    more = [40, 41, 42]
    engine.extend(seq_id, None, token_ids=more, readout_positions=[len(tokens) + 2])
    outputs = run_until_idle(engine)
    assert engine.get(seq_id).usage.computed_tokens == len(tokens) + len(more)  # the prefix is reused
    with torch.no_grad():
        expected = reference(torch.tensor([tokens + more])).logits[0, [-1]]
    assert (outputs[seq_id][-1].readouts.cpu() - expected).abs().max() < 1e-4


def test_bad_inputs_raise_clear_errors(engine):
    with pytest.raises(ValueError, match="at least one token"):
        engine.add([], GREEDY)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add([5] * 600, GREEDY)
    with pytest.raises(ValueError, match="token ids"):
        engine.add([10_000], GREEDY)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    seq_id = engine.add(PROMPT, GREEDY)
    with pytest.raises(ValueError, match="not paused"):
        engine.extend(seq_id)
    with pytest.raises(ValueError, match="readout_positions"):
        engine.add(PROMPT, None)


def test_pause_resume_and_set_priority(engine):
    params = SamplingParams(temperature=0.0, max_new_tokens=10, ignore_eos=True)
    seq_id = engine.add(PROMPT, params)
    engine.step()
    engine.step()
    assert engine.pause(seq_id) is True
    assert engine.step() == [] and not engine.has_work()
    engine.set_priority(seq_id, 5)
    engine.resume(seq_id)
    outputs = run_until_idle(engine)
    assert engine.get(seq_id) is None and outputs[seq_id][-1].finish_reason == FinishReason.LENGTH
    assert len(generated(outputs, seq_id)) == 8  # 2 before the pause + 8 after = the segment's 10


def test_prefix_cache_never_skips_a_readout_position(engine):
    tokens = list(range(3, 63))
    first = engine.add(tokens, None, readout_positions=[10, 56])
    out_first = run_until_idle(engine)[first][-1].readouts
    second = engine.add(tokens + [61], None, readout_positions=[10, 57])
    out_second = run_until_idle(engine)[second][-1].readouts
    assert out_second.shape[0] == 2  # position 10 lies in a cached block: it must still be read
    assert torch.allclose(out_first[0], out_second[0], atol=1e-5)
    assert engine.block_manager.num_cache_hit_tokens == 8  # only the blocks before position 10


def test_low_priority_rows_only_fill_spare_room(qwen2_dir):
    for num_real, expected_speculative in ((2, 1), (3, 0), (5, 0)):
        engine = make_engine(qwen2_dir, spare_rows=3)
        real = [engine.add(PROMPT, GREEDY) for _ in range(num_real)]
        speculative = [engine.add(PROMPT, GREEDY, priority=-1) for _ in range(3)]
        rows = {row.seq.seq_id for row in engine.scheduler.schedule().rows}
        assert set(real) <= rows  # real rows are never capped by the spare room
        assert len(rows & set(speculative)) == expected_speculative
        for seq_id in real + speculative:
            engine.abort(seq_id)


def test_spare_room_goes_to_speculative_rows_in_the_order_the_search_ranks_them(qwen2_dir):
    """The search ranks speculative work by priority (search/speculation.py: depth band, then the parent's
    survival rank); with room for two of them the scheduler takes the two it ranks first, whatever order they
    were added in, and among equal priorities the older one."""
    engine = make_engine(qwen2_dir, spare_rows=3)
    real = engine.add(PROMPT, GREEDY)
    priorities = (-205, -101, -100, -102, -101)  # added out of rank order; -101 twice: the first is older
    speculative = [engine.add(PROMPT, GREEDY, priority=p) for p in priorities]
    rows = [row.seq.seq_id for row in engine.scheduler.schedule().rows]
    assert rows == [real, speculative[2], speculative[1]]
    for seq_id in [real, *speculative]:
        engine.abort(seq_id)


def test_seeded_extend_samples_like_a_seeded_add(engine):
    """A forked prompt prefix extended with seed s draws the same tokens as a fresh sequence added with
    seed s, whatever the engine sampled before (the search's paired seeds rely on this)."""
    params = SamplingParams(temperature=1.0, max_new_tokens=8, ignore_eos=True, seed=1234)
    fresh = engine.add(PROMPT, params)
    expected = generated(run_until_idle(engine), fresh)
    engine.abort(fresh)
    prefix = engine.add(PROMPT[:-1], None, readout_positions=[len(PROMPT) - 2])
    noise = engine.add(PROMPT, SamplingParams(temperature=1.0, max_new_tokens=5, ignore_eos=True))
    run_until_idle(engine)  # unseeded draws move the engine's shared generator
    child = engine.fork(prefix, 1)[0]
    engine.extend(child, params, token_ids=[PROMPT[-1]])
    assert generated(run_until_idle(engine), child) == expected
    for seq_id in (prefix, noise, child):
        engine.abort(seq_id)


def lane_paths(engine, root: int) -> list[tuple[int, ...]]:
    """Run to idle; the token path of every logical copy of the CD row `root`, as a sorted multiset."""
    paths: dict[int, list[int]] = {root: []}
    copies: dict[int, int] = {}
    while engine.has_work():
        for out in engine.step():
            if out.parent_id is not None:  # split this iteration: the parent's output came first
                paths[out.seq_id] = paths[out.parent_id][:-1]
            paths[out.seq_id] += out.new_token_ids
            copies[out.seq_id] = out.multiplicity
        check_blocks(engine)
    return sorted(tuple(p) for seq_id, p in paths.items() for _ in range(copies[seq_id]))


def test_cd_row_with_lane_seeds_samples_what_separate_seeded_rows_sample(qwen2_dir):
    """Each logical copy of a multiplicity-m row draws from its own lane (docs/design.md, "Seeds"): the m
    token paths equal those of m separate rows seeded with the lane seeds (old engine: one stream per row)."""
    seeds = (101, 202, 303, 404, 505, 606)
    params = SamplingParams(temperature=1.5, max_new_tokens=6, ignore_eos=True, seed=seeds[0])
    engine = make_engine(qwen2_dir)
    root = engine.add(PROMPT, params, multiplicity=len(seeds), lane_seeds=seeds)
    together = lane_paths(engine, root)
    separate = []
    for seed in seeds:
        seq = engine.add(PROMPT, SamplingParams(temperature=1.5, max_new_tokens=6, ignore_eos=True, seed=seed))
        separate.append(tuple(generated(run_until_idle(engine), seq)))
    assert together == sorted(separate)
    assert len(set(separate)) > 1
    assert engine.block_manager.num_used_blocks == 0
