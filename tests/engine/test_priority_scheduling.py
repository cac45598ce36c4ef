"""vLLM's ``scheduling_policy="priority"``: admission in (priority, arrival) order, the lowest
priority preempted first, and "fcfs" exactly as before (priorities refused, not ignored)."""
from __future__ import annotations

import random

import pytest

from inferlab.engine.config import EngineConfig
from inferlab.llm import LLM
from inferlab.sampling import SamplingParams

from .conftest import make_engine, run_all


def params(n):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def trace(engine) -> list:
    """Every step as (request id, first position, token count) per scheduled sequence, plus who was preempted."""
    steps = []
    engine.step_hooks.append(lambda e, rec: steps.append(
        [(r["request_id"], r["start"], r["num_new_tokens"]) for r in rec["scheduled"]] + [rec["preempted"]]))
    return steps


def first_scheduled(steps) -> list[str]:
    order = []
    for step in steps:
        for rid, *_ in step[:-1]:
            if rid not in order:
                order.append(rid)
    return order


def test_admission_follows_priority_then_arrival(tiny):
    prios = [5, 1, 3, 1, 0, 3]
    engine = make_engine(tiny, block_size=4, max_num_seqs=1, scheduling_policy="priority")
    steps = trace(engine)
    for i, p in enumerate(prios):
        engine.add_request(f"r{i}", [7 + i, 8, 9], params(3), priority=p)
    run_all(engine)
    assert first_scheduled(steps) == ["r4", "r1", "r3", "r2", "r5", "r0"]  # lower first; ties by arrival


def test_ties_go_by_arrival_time_not_by_call_order(tiny):
    for policy in ("continuous", "static"):
        engine = make_engine(tiny, block_size=4, max_num_seqs=1, scheduling_policy="priority", batching_policy=policy)
        steps = trace(engine)
        for rid, arrival in (("late", 30.0), ("early", 10.0), ("mid", 20.0)):
            engine.add_request(rid, [7, 8, 9], params(2), arrival_time=arrival, priority=1)
        run_all(engine)
        assert first_scheduled(steps) == ["early", "mid", "late"], policy


def test_a_later_more_urgent_request_overtakes_the_waiting_queue(tiny):
    engine = make_engine(tiny, block_size=4, max_num_seqs=1, scheduling_policy="priority")
    steps = trace(engine)
    for i in range(3):
        engine.add_request(f"bg{i}", [7 + i, 8, 9], params(4), priority=2)
    engine.step()                                   # bg0 runs; bg1, bg2 wait
    engine.add_request("urgent", [50, 51], params(2), priority=0)
    run_all(engine)
    assert first_scheduled(steps) == ["bg0", "urgent", "bg1", "bg2"]


def test_kv_shortage_preempts_the_lowest_priority_newest_first(tiny):
    # three 4-token prompts fill one block each of a 3-block pool; the first decode needs a 4th block
    engine = make_engine(tiny, block_size=4, num_kv_blocks=3, max_num_seqs=3, scheduling_policy="priority")
    steps = trace(engine)
    for rid, p in (("a", 0), ("low-old", 7), ("b", 2), ("low-new", 7)):
        engine.add_request(rid, [11, 12, 13, 14], params(6), priority=p)
    engine.step()                                   # a, b, low-old prefilled (low-new waits: 3 slots)
    assert sorted(r for r, *_ in steps[-1][:-1]) == ["a", "b", "low-old"]
    engine.step()        # a's decode needs a block: the lowest priority goes (then b, short too, steps back)
    assert steps[-1][-1] == ["low-old", "b"]
    run_all(engine)
    preempted = [rid for step in steps for rid in step[-1]]
    assert "a" not in preempted                     # the most urgent is never the victim while others run


def test_ties_preempt_the_newest_arrival(tiny):
    engine = make_engine(tiny, block_size=4, num_kv_blocks=3, max_num_seqs=3, scheduling_policy="priority")
    steps = trace(engine)
    for rid in ("old", "mid", "new"):
        engine.add_request(rid, [11, 12, 13, 14], params(6), priority=4)
    engine.step()
    engine.step()                                   # old grows: the newest goes; mid, short too, steps back
    assert steps[-1][-1] == ["new", "mid"]


def test_a_waiting_urgent_request_takes_a_low_priority_batch_slot(tiny):
    engine = make_engine(tiny, block_size=4, num_kv_blocks=64, max_num_seqs=2, scheduling_policy="priority")
    steps = trace(engine)
    for j in range(2):
        engine.add_request(f"job{j}", [20 + j, 21, 22], params(30), priority=10)
    engine.step()
    engine.add_request("user", [40, 41, 42], params(2), priority=0)
    engine.step()                                   # no free slot: the newest job gives its slot at once
    assert steps[-1][-1] == ["job1"] and "user" in [r for r, *_ in steps[-1][:-1]]


def workload(seed=0, n=14, prios=(0, 1, 5)):
    rng = random.Random(seed)
    return [(f"r{i}", [rng.randrange(3, 160) for _ in range(rng.randint(2, 14))], params(rng.randint(2, 12)),
             rng.choice(prios)) for i in range(n)]


TIGHT = dict(block_size=4, num_kv_blocks=14, max_num_seqs=4)  # preemptions on every policy


def test_greedy_outputs_do_not_depend_on_priorities(tiny):
    """The schedule changes who waits, never what anyone gets: greedy tokens under "priority" with
    mixed priorities equal those under "fcfs" without them."""
    outs, engines = {}, {}
    for policy in ("fcfs", "priority"):
        e = engines[policy] = make_engine(tiny, scheduling_policy=policy, **TIGHT)
        for rid, prompt, p, prio in workload():
            e.add_request(rid, prompt, p, priority=prio if policy == "priority" else 0)
        outs[policy] = {r: o.outputs[0].token_ids for r, o in run_all(e).items()}
    assert outs["fcfs"] == outs["priority"] and len(outs["fcfs"]) == 14
    assert engines["fcfs"].num_preemptions > 0 and engines["priority"].num_preemptions > 0


def test_fcfs_is_unchanged_by_an_explicit_zero_priority_and_refuses_others(tiny):
    runs = []
    for explicit in (False, True):
        e = make_engine(tiny, **TIGHT)
        steps = trace(e)
        for rid, prompt, p, _ in workload(1):
            e.add_request(rid, prompt, p, **({"priority": 0} if explicit else {}))
        run_all(e)
        runs.append(steps)
    assert runs[0] == runs[1] and any(step[-1] for step in runs[0])
    e = make_engine(tiny, **TIGHT)
    with pytest.raises(ValueError, match="scheduling_policy='priority'"):
        e.add_request("x", [1, 2, 3], params(2), priority=3)
    assert not e.has_unfinished_requests()


def test_one_level_is_the_continuous_policy_without_preemptions(tiny):
    """All at one priority and a pool large enough: "priority" schedules step for step as "fcfs"."""
    runs = []
    for policy in ("fcfs", "priority"):
        e = make_engine(tiny, block_size=4, num_kv_blocks=200, max_num_seqs=3, scheduling_policy=policy)
        steps = trace(e)
        for rid, prompt, p, _ in workload(2):
            e.add_request(rid, prompt, p)
        run_all(e)
        runs.append(steps)
    assert runs[0] == runs[1]


def test_llm_generate_takes_vllm_priority_list(tiny):
    model, tok = tiny
    llm = LLM.from_model(model, tok, scheduling_policy="priority", max_num_seqs=1, block_size=4)
    prompts = [[5, 6, 7], [8, 9, 10], [11, 12, 13]]
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params(3), priority=[2, 0, 1])
    assert [o.request_id for o in outs] == ["0", "1", "2"]  # outputs stay in prompt order
    firsts = [o.metrics.first_token_time for o in outs]
    assert firsts[1] < firsts[2] < firsts[0]              # served by priority
    with pytest.raises(Exception, match="one per prompt"):
        llm.generate(prompt_token_ids=prompts, priority=[0, 1])
    fcfs = LLM.from_model(model, tok, block_size=4)
    with pytest.raises(ValueError, match="scheduling_policy='priority'"):
        fcfs.generate(prompt_token_ids=prompts, priority=[2, 0, 1])


def test_bad_knobs_say_what_to_do(tiny):
    with pytest.raises(ValueError, match="'fcfs'.*'priority'"):
        make_engine(tiny, scheduling_policy="lifo")
    e = make_engine(tiny, scheduling_policy="priority")
    with pytest.raises(ValueError, match="integer"):
        e.add_request("x", [1, 2], params(2), priority=0.5)
    assert EngineConfig().scheduling_policy == "fcfs"
