"""The engine gives the contiguous reference path's tokens, whatever its knobs."""
from __future__ import annotations

import pytest
import torch

from inferlab import LLM, SamplingParams
from inferlab.generate import generate

from .conftest import make_engine, run_all

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def push(self, x):", "x",
           "for i in range(10):\n    print(i)\n"]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def reference(pair, prompts, params=GREEDY):
    model, tok = pair
    ids = [tok.encode(p) for p in prompts]
    return [s.output_token_ids for s in generate(model, ids, [params] * len(ids), model.config.eos_token_ids, tok)]


def engine_tokens(pair, prompts, params=GREEDY, late=0, **knobs):
    """Greedy tokens of every prompt through one engine; the last ``late`` prompts arrive after
    the first step (prefix caching names a block once its K/V is computed)."""
    engine, finals = make_engine(pair, **knobs), {}
    for i, p in enumerate(prompts):
        if late and i == len(prompts) - late:
            finals.update({o.request_id: o for o in engine.step() if o.finished})
        engine.add_request(str(i), p, params)
    finals.update(run_all(engine))
    assert engine.kv_cache_stats()["used_blocks"] == 0
    return [finals[str(i)].outputs[0].token_ids for i in range(len(prompts))], engine


def test_greedy_equals_contiguous_reference(target):
    ref = reference(target, PROMPTS)
    got, engine = engine_tokens(target, PROMPTS)
    assert got == ref
    solo = [engine_tokens(target, [p])[0][0] for p in PROMPTS[:2]]
    assert solo == ref[:2]


def test_llm_generate_runs_on_the_engine(target):
    llm = LLM("target", device="cpu", max_num_seqs=4)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference(target, PROMPTS)
    assert [o.request_id for o in outs] == [str(i) for i in range(len(PROMPTS))]
    assert outs[0].prompt == PROMPTS[0] and outs[0].metrics.first_token_time is not None
    assert llm.llm_engine.kv_cache_stats()["free_blocks"] == llm.llm_engine.config.num_kv_blocks
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate(prompt_token_ids=[[5, 6], [7] * 600], sampling_params=GREEDY)
    assert not llm.llm_engine.has_unfinished_requests()  # the good prompt was withdrawn too


@pytest.mark.parametrize("knobs", [dict(enable_prefix_caching=True),
                                   dict(enable_chunked_prefill=True, max_num_batched_tokens=8, max_num_seqs=4),
                                   dict(enable_chunked_prefill=True, enable_prefix_caching=True,
                                        max_num_batched_tokens=16, block_size=4, max_num_seqs=4),
                                   dict(batching_policy="static", max_num_seqs=2),
                                   dict(block_size=1), dict(block_size=64)])
def test_knobs_do_not_change_greedy_tokens(target, knobs):
    shared = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    prompts = PROMPTS + [shared, shared + "def mul(a, b):", shared + "def div(a, b):"]
    got, engine = engine_tokens(target, prompts, late=2, **knobs)
    assert got == reference(target, prompts)
    if knobs.get("enable_prefix_caching"):
        assert engine.kv_cache_stats()["prefix_hits"] > 0


def record_copies(engine) -> list:
    """Wrap the KV cache's copy_blocks: every copy-on-write pair, and the K rows it copied."""
    seen, copy = [], engine.kv_cache.copy_blocks

    def recording(pairs):
        copy(pairs)
        for src, dst in pairs:
            seen.append((src, dst, torch.equal(engine.kv_cache.k[:, dst], engine.kv_cache.k[:, src])))
    engine.kv_cache.copy_blocks = recording
    return seen


def test_parallel_sampling_forks_copy_on_write(target):
    prompt = PROMPTS[0]  # 5 tokens: its last block of 4 is partly filled, so children must copy it
    ids = target[1].encode(prompt)
    assert len(ids) % 4 != 0
    engine = make_engine(target, block_size=4)
    copies = record_copies(engine)
    engine.add_request("g", prompt, SamplingParams(temperature=0, max_tokens=10, n=3, ignore_eos=True))
    engine.add_request("s", prompt, SamplingParams(temperature=1.0, seed=7, max_tokens=10, n=3, ignore_eos=True))
    engine.step()  # both prompts prefilled, children forked: they share the prompt's blocks
    assert engine.kv_cache_stats()["shared_blocks"] > 0 and engine.num_running == 6 and not copies
    engine.step()  # each writes its first own token into the shared partial block: two of three copy
    assert len(copies) == 4 and all(same for _, _, same in copies)
    assert len({dst for _, dst, _ in copies}) == 4
    finals = run_all(engine)
    greedy = [c.token_ids for c in finals["g"].outputs]
    assert [c.index for c in finals["g"].outputs] == [0, 1, 2]
    assert greedy == [reference(target, [prompt], SamplingParams(temperature=0, max_tokens=10))[0]] * 3
    sampled = [c.token_ids for c in finals["s"].outputs]
    assert len({tuple(t) for t in sampled}) > 1  # seed + i per child
    assert engine.kv_cache_stats()["used_blocks"] == 0
    again = make_engine(target, block_size=4)  # one at a time: each sequence's own blocks, same draws
    again.add_request("s", prompt, SamplingParams(temperature=1.0, seed=7, max_tokens=10, n=3, ignore_eos=True))
    assert [c.token_ids for c in run_all(again)["s"].outputs] == sampled


def test_forked_children_do_not_recompute_the_prompt(target):
    """n = 3: the prompt is prefilled once; the children start from the parent's computed K/V."""
    engine = make_engine(target, block_size=4)
    ids = target[1].encode(PROMPTS[2])
    engine.add_request("g", ids, SamplingParams(temperature=0, max_tokens=4, n=3, ignore_eos=True))
    run_all(engine)
    c = engine.counters
    assert c["num_prompt_tokens"] == c["prefill_tokens"] == len(ids)
    assert c["decode_tokens"] == 3 * 3 and c["num_generation_tokens"] == 3 * 4


def test_prefill_and_decode_counters_for_a_one_token_prompt(target):
    """A 1-token prompt's prefill computes one token, but it is a prefill, not a decode."""
    engine = make_engine(target)
    engine.add_request("one", [5], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    run_all(engine)
    c = engine.counters
    assert (c["num_prompt_tokens"], c["prefill_tokens"], c["decode_tokens"], c["num_steps"]) == (1, 1, 3, 4)
    assert c["prefill_s"] > 0 and c["decode_s"] > 0


def test_abort_frees_blocks(target):
    engine = make_engine(target, block_size=4)
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=50, n=2 if i == 0 else 1))
    for _ in range(3):
        engine.step()
    assert engine.kv_cache_stats()["used_blocks"] > 0
    for i in range(len(PROMPTS)):
        engine.abort_request(str(i))
    stats = engine.kv_cache_stats()
    assert stats["used_blocks"] == 0 and stats["free_blocks"] == stats["total_blocks"]
    assert not engine.has_unfinished_requests() and engine.step() == []


def test_streaming_deltas_add_up(target):
    engine = make_engine(target)
    engine.add_request("a", PROMPTS[0], SamplingParams(temperature=0, max_tokens=30, stop=["\n\n"]))
    engine.add_request("b", PROMPTS[1], SamplingParams(temperature=0, max_tokens=30))
    text = {"a": "", "b": ""}
    ids = {"a": [], "b": []}
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            text[out.request_id] += out.outputs[0].delta_text
            ids[out.request_id] += out.outputs[0].delta_token_ids
            if out.finished:
                final[out.request_id] = out.outputs[0]
    for rid in "ab":
        assert text[rid] == final[rid].text and ids[rid] == final[rid].token_ids
    assert "\n\n" not in final["a"].text


def test_counters_and_stats(target):
    engine = make_engine(target, block_size=8)
    engine.add_request("a", PROMPTS[0], GREEDY)
    out = run_all(engine)["a"]
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
    stats = engine.kv_cache_stats()
    assert {"free_blocks", "total_blocks", "used_blocks", "block_size", "usage", "prefix_hit_rate"} <= set(stats)
    assert stats["block_size"] == 8 and stats["usage"] == 0.0
    assert engine.counters["num_generation_tokens"] == 24 and engine.num_preemptions == 0


@pytest.mark.parametrize("knobs, message", [
    (dict(block_size=3), "power of two"), (dict(block_size=0), "power of two"),
    (dict(batching_policy="fifo"), "batching_policy"), (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(max_num_batched_tokens=64), "enable_chunked_prefill"),
    (dict(max_num_batched_tokens=8, enable_chunked_prefill=True), "max_num_seqs"),
    (dict(num_kv_blocks=0), "num_kv_blocks"), (dict(max_model_len=10_000), "max_model_len")])
def test_bad_knobs_are_one_line_errors(target, knobs, message):
    with pytest.raises(ValueError, match=message) as err:
        make_engine(target, **knobs)
    assert "\n" not in str(err.value)


def test_bad_requests_are_one_line_errors(target):
    engine = make_engine(target, block_size=4, num_kv_blocks=4)
    with pytest.raises(ValueError, match="whole KV pool"):
        engine.add_request("long", list(range(1, 30)), GREEDY)
    with pytest.raises(ValueError, match="empty prompt"):
        engine.add_request("empty", [], GREEDY)
    engine.add_request("a", [1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("a", [1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="max_num_seqs"):
        engine.add_request("n", [1, 2], SamplingParams(max_tokens=2, n=100))
