"""Scheduler behaviour: a soak through a small pool (preemption), static vs continuous, budgets."""
from __future__ import annotations

import random

from inferlab.generate import generate
from inferlab.sampling import SamplingParams

from .conftest import make_engine, run_all, same_greedy


def test_soak_a_thousand_requests_through_a_small_pool(tiny):
    """1,000 short requests, a pool far smaller than their total: preemption happens, every request
    completes and equals its solo greedy run of the contiguous path, and every block comes back."""
    model, _ = tiny
    rng = random.Random(0)
    engine = make_engine(tiny, block_size=4, num_kv_blocks=16, max_num_seqs=8, max_num_batched_tokens=24,
                         enable_chunked_prefill=True, enable_prefix_caching=True)
    requests = {}
    systems = [[rng.randrange(3, 160) for _ in range(8)] for _ in range(3)]  # two blocks each
    for i in range(1000):
        prompt = [rng.randrange(3, 160) for _ in range(rng.randint(1, 12))]
        if rng.random() < 0.4:  # opens with a shared system prompt
            prompt = rng.choice(systems) + prompt[:4]
        params = SamplingParams(temperature=0, max_tokens=rng.randint(1, 10), ignore_eos=True)
        requests[str(i)] = (prompt, params)
    pending = list(requests.items())
    finals = {}
    while pending or engine.has_unfinished_requests():
        k = rng.randint(0, 40)  # arrivals while the engine runs
        for rid, (prompt, params) in pending[:k]:
            engine.add_request(rid, prompt, params)
        pending = pending[k:]
        for out in engine.step() if engine.has_unfinished_requests() else []:
            if out.finished:
                finals[out.request_id] = out
    assert len(finals) == 1000
    assert all(len(finals[r].outputs[0].token_ids) == p.max_tokens for r, (_, p) in requests.items())
    assert engine.num_preemptions > 0
    stats = engine.kv_cache_stats()
    assert stats["prefix_hits"] > 100
    assert stats["free_blocks"] == stats["total_blocks"] and stats["used_blocks"] == 0
    solo: dict[tuple, list[int]] = {}  # greedy: a shorter answer is a prefix of the 10-token one
    longest = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    for rid, (prompt, params) in requests.items():
        if tuple(prompt) not in solo:
            solo[tuple(prompt)] = generate(model, [prompt], [longest])[0].output_token_ids
        got = finals[rid].outputs[0].token_ids
        assert same_greedy(model, prompt, got, solo[tuple(prompt)][:params.max_tokens]), (rid, got)


def record_steps(engine) -> list:
    """Wrap the scheduler so every step's SchedulerOutput is kept."""
    steps, schedule = [], engine.scheduler.schedule

    def recording():
        out = schedule()
        steps.append([(s.seq.request_id, s.num_new_tokens) for s in out.scheduled])
        return out

    engine.scheduler.schedule = recording
    return steps


def test_static_waits_for_the_batch_continuous_does_not(tiny):
    lengths = [2, 20, 2, 2]
    finals = {}
    for policy in ("continuous", "static"):
        engine = make_engine(tiny, max_num_seqs=2, batching_policy=policy)
        for i, n in enumerate(lengths):
            engine.add_request(str(i), [5, 6, 7], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        finals[policy] = run_all(engine)
    c, s = ({r: o.metrics for r, o in finals[p].items()} for p in ("continuous", "static"))
    assert c["2"].first_scheduled_time < c["1"].finished_time  # joins as soon as request 0 leaves
    assert s["2"].first_scheduled_time >= s["1"].finished_time  # waits for the longest of its batch
    assert ({r: o.outputs[0].token_ids for r, o in finals["continuous"].items()}
            == {r: o.outputs[0].token_ids for r, o in finals["static"].items()})


def test_token_budget_and_chunks(tiny):
    engine = make_engine(tiny, max_num_seqs=4, max_num_batched_tokens=8, enable_chunked_prefill=True)
    steps = record_steps(engine)
    engine.add_request("long", list(range(3, 30)), SamplingParams(temperature=0, max_tokens=3))
    engine.add_request("short", [3, 4], SamplingParams(temperature=0, max_tokens=3))
    run_all(engine)
    assert all(sum(n for _, n in step) <= 8 for step in steps)
    assert [n for rid, n in sum(steps, []) if rid == "long"][:4] == [8, 8, 8, 3]  # 27 prompt tokens in chunks
    assert steps[3] == [("long", 3), ("short", 2)]  # FCFS: the short prompt waited for the budget


def test_preemption_takes_the_newest_and_requeues_it_first(tiny):
    engine = make_engine(tiny, block_size=2, num_kv_blocks=8, max_num_seqs=3)
    for i in range(3):
        engine.add_request(str(i), [5, 6, 7], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    while engine.num_preemptions == 0:
        engine.step()
    assert engine.scheduler.waiting[0].request_id == "2"
    assert [s.request_id for s in engine.scheduler.running] == ["0", "1"]
    finals = run_all(engine)
    solo = generate(tiny[0], [[5, 6, 7]], [SamplingParams(temperature=0, max_tokens=8)])[0].output_token_ids
    assert all(o.outputs[0].token_ids == solo for o in finals.values())


def test_the_policy_seam_takes_a_new_policy(tiny):
    from inferlab.engine import policy

    class OneAtATime(policy.BatchingPolicy):
        def schedule(self, s):
            out = policy.SchedulerOutput()
            budget = policy.schedule_running(s, out, s.max_num_batched_tokens)
            if not s.running and s.waiting:
                s.admit(s.waiting[0], budget, out)
            return out

    policy.POLICIES["one"] = OneAtATime
    try:
        engine = make_engine(tiny)
        engine.scheduler.policy = policy.get_policy("one")
        steps = record_steps(engine)
        for i in range(3):
            engine.add_request(str(i), [5, 6], SamplingParams(temperature=0, max_tokens=3))
        run_all(engine)
        assert max(len(s) for s in steps) == 1 and len(steps) == 9
    finally:
        del policy.POLICIES["one"]


def test_forks_to_come_hold_their_sequence_slots(tiny):
    engine = make_engine(tiny, max_num_seqs=4)
    peak = []
    for i in range(4):
        engine.add_request(str(i), [5, 6, 7 + i], SamplingParams(temperature=1.0, seed=i, max_tokens=4, n=2))
    while engine.has_unfinished_requests():
        engine.step()
        peak.append(engine.num_running)
    assert max(peak) == 4
