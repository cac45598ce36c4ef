"""TP=2 (two gloo ranks: this process and one worker) computes what TP=1 computes, through the
engine's own model runner and paged KV cache."""
from __future__ import annotations

import pytest
import torch

from inferlab import LLM
from inferlab.engine.model_runner import SeqInput
from inferlab.model.loader import load_checkpoint
from inferlab.sampling import SamplingParams

PROMPT = [5, 77, 301, 12, 4000, 9, 64, 1023, 7, 3, 250, 18, 99, 2048, 33, 1, 600, 42]  # 18 tokens: 2 blocks


@pytest.fixture(scope="module", params=["target", "mqa", "moe"])
def pair(request):
    llm = LLM(request.param, device="cpu", dtype="float32", tensor_parallel_size=2, num_kv_blocks=8, max_num_seqs=4)
    full, _ = load_checkpoint(request.param, device="cpu", dtype=torch.float32)
    yield request.param, llm, full
    llm.shutdown()


def test_logits_equal_tp1(pair):
    """Prefill (18 tokens over two KV blocks) and two decode steps read back the sharded KV cache."""
    name, llm, full = pair
    runner, table = llm.llm_engine.runner, [3, 5]
    ids = list(PROMPT)
    tp2 = runner.execute([SeqInput(ids, 0, table)], all_logits=True)[0]
    with torch.inference_mode():
        ref = full(torch.tensor([ids]))[0]
    torch.testing.assert_close(tp2, ref, rtol=1e-5, atol=1e-5)  # the sums run in another order
    for tok in (int(ref[-1].argmax()), 17):
        step = runner.execute([SeqInput([tok], len(ids), table)])
        ids.append(tok)
        with torch.inference_mode():
            ref = full(torch.tensor([ids]))[0, -1]
        torch.testing.assert_close(step[0], ref, rtol=1e-5, atol=1e-5)


def test_kv_cache_holds_the_local_heads(pair):
    name, llm, full = pair
    cache = llm.llm_engine.kv_cache
    assert cache.k.shape[3] == max(1, full.config.num_key_value_heads // 2)


@pytest.mark.parametrize("pair", ["target"], indirect=True)  # one model is enough for the engine loop
def test_greedy_generate_matches_tp1(pair):
    name, llm, full = pair
    prompts = ["def fib(n):", "import os\n", "class Stack:"]
    params = SamplingParams(max_tokens=16, temperature=0)
    ref = LLM(name, device="cpu", dtype="float32", num_kv_blocks=8, max_num_seqs=4).generate(prompts, params)
    got = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in ref]


@pytest.mark.parametrize("pair", ["target"], indirect=True)
def test_rank0_counts_its_own_collectives(pair):
    """The counters belong to the engine's runner: one decode step of an L-layer model is 2L + 1
    all-reduces and one all-gather, and a fresh shard's counters start at zero."""
    from inferlab.parallel.comm import CollectiveStats
    from inferlab.parallel.loader import build_shard

    name, llm, full = pair
    runner = llm.llm_engine.runner
    before = runner.comm.stats.as_dict()
    runner.execute([SeqInput([5, 6, 7], 0, [2])])
    runner.execute([SeqInput([8], 3, [2])])  # one decode step, counted alone below
    mid = runner.comm.stats.as_dict()
    runner.execute([SeqInput([9], 4, [2])])
    after = runner.comm.stats.as_dict()
    assert after["all_reduce"] - mid["all_reduce"] == 2 * full.config.num_hidden_layers + 1
    assert after["all_gather"] - mid["all_gather"] == 1 and mid["all_reduce"] > before["all_reduce"]
    with torch.device("meta"):
        other = build_shard(full.config, 0, 2)
    assert other.model.embed_tokens.comm.stats == CollectiveStats()  # no counter shared between engines
    assert runner.model is llm.model and runner.block_size == llm.llm_engine.kv_cache.block_size
    with pytest.raises(AttributeError):
        runner.prepare  # noqa: B018 - the runner shows what a ModelRunner shows, nothing forwarded blindly
