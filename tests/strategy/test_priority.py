"""Priority scheduling and background precompute on the real engine (the small embedded model)."""
import numpy as np
import pytest

from inferlab.engine import EngineConfig, LLMEngine
from inferlab.engine.policy import ContinuousPolicy
from inferlab.loader import load_checkpoint
from inferlab.sampling import SamplingParams
from inferlab.strategy import priority as P


@pytest.fixture(scope="module")
def model():
    return load_checkpoint("mha", device="cpu")


def engine(model, **knobs):
    return LLMEngine(*model, EngineConfig(**{"block_size": 4, **knobs}))


def params(n):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def interactive_load(seed=0, n=12):
    """Bursts of interactive requests with gaps between them (ticks with nothing to do)."""
    rng = np.random.default_rng(seed)
    arrivals = {}
    for i in range(n):
        tick = int(i // 4) * 40 + int(rng.integers(0, 6))   # 3 bursts of 4, 40 ticks apart
        prompt = [int(t) for t in rng.integers(5, 200, size=int(rng.integers(6, 20)))]
        arrivals.setdefault(tick, []).append((f"user-{i}", prompt, params(int(rng.integers(4, 12))), P.INTERACTIVE))
    return arrivals


KNOBS = dict(num_kv_blocks=24, max_num_seqs=4)  # tight: the job must give way


def test_interactive_schedule_is_unchanged_by_a_background_job_which_still_completes(model):
    alone = engine(model, **KNOBS)
    P.use_priority(alone)
    base = P.run(alone, interactive_load())

    busy = engine(model, **KNOBS)
    P.use_priority(busy)
    pre = P.Precompute()
    load = interactive_load()
    jobs = [pre.job(f"report-{j}", list(range(10 + j, 40 + j)), params(30)) for j in range(3)]
    load.setdefault(0, []).extend(jobs)
    with_job = P.run(busy, load, on_output=pre.on_output)

    users = sorted(base.arrival)
    assert [base.ttft(r) for r in users] == [with_job.ttft(r) for r in users]        # TTFT in steps
    assert [base.tpot(r) for r in users] == [with_job.tpot(r) for r in users]        # TPOT in steps
    assert [base.finished[r] for r in users] == [with_job.finished[r] for r in users]
    assert busy.num_preemptions > 0          # the job did get in the way, and gave way
    assert sorted(pre.results) == ["report-0", "report-1", "report-2"]            # and it finished
    assert max(with_job.finished[f"precompute-report-{j}"] for j in range(3)) > max(base.finished.values()) - 40
    # the job used the gaps: it finished before the last burst ended, not only after all load
    assert min(with_job.finished[f"precompute-report-{j}"] for j in range(3)) < max(base.finished.values())


def test_one_level_schedules_as_the_continuous_policy(model):
    """With every request at the same priority the policy is the engine's continuous policy, step by step."""
    records = []
    for use in (False, True):
        e = engine(model, num_kv_blocks=12, max_num_seqs=3)
        steps = []
        e.step_hooks.append(lambda eng, rec: steps.append(
            [(r["request_id"], r["start"], r["num_new_tokens"]) for r in rec["scheduled"]] + [rec["preempted"]]))
        if use:
            P.use_priority(e)
        else:
            assert isinstance(e.scheduler.policy, ContinuousPolicy)
        rng = np.random.default_rng(1)
        for i in range(8):
            e.add_request(f"r{i}", [int(t) for t in rng.integers(5, 200, size=9 + i)], params(6 + i % 3))
        while e.has_unfinished_requests():
            e.step()
        records.append(steps)
    assert records[0] == records[1] and any(s[-1] for s in records[0])  # preemptions included


def test_waiting_interactive_preempts_a_running_job(model):
    e = engine(model, num_kv_blocks=40, max_num_seqs=2)
    P.use_priority(e)
    for j in range(2):
        P.add_request(e, f"job{j}", list(range(10, 30)), params(40), P.BACKGROUND)
    e.step()
    assert e.num_running == 2
    P.add_request(e, "user", list(range(50, 60)), params(3))
    e.step()
    running = [s.request_id for s in e.scheduler.running]
    assert "user" in running and e.num_preemptions == 1 and running.count("job0") == 1  # the newest job left


def test_a_job_preempted_for_a_running_request_does_not_delay_admissions(model):
    e = engine(model, num_kv_blocks=12, max_num_seqs=4)
    P.use_priority(e)
    P.add_request(e, "user0", list(range(10, 18)), params(5))           # 2 blocks; its first decode needs a 3rd
    for j in range(2):
        P.add_request(e, f"job{j}", list(range(20, 40)), params(20), P.BACKGROUND)  # 5 blocks each: pool full
    e.step()
    assert e.block_manager.num_free_blocks == 0
    P.add_request(e, "user1", list(range(50, 58)), params(3))
    e.step()                                   # user0 grows (job1 preempted), then user1 is admitted at once
    running = [s.request_id for s in e.scheduler.running]
    assert running == ["user0", "job0", "user1"]    # job1 was preempted; user1 did not wait a step


def test_precomputed_answer_equals_the_interactive_one(model):
    e = engine(model)
    P.use_priority(e)
    pre = P.Precompute()
    prompt = list(range(30, 50))
    P.run(e, {0: [pre.job("daily", prompt, params(16)), ("now", prompt, params(16), P.INTERACTIVE)]},
          on_output=lambda out: (pre.on_output(out), outs.__setitem__(out.request_id, out)))
    assert pre.serve("daily") == outs["now"].outputs[0].text and pre.serve("other") is None


outs = {}


def test_clear_errors(model):
    e = engine(model)
    with pytest.raises(ValueError, match="use_priority"):
        P.add_request(e, "a", [1, 2, 3], params(2))
    e.add_request("x", [1, 2, 3], params(2))
    with pytest.raises(ValueError, match="before adding requests"):
        P.use_priority(e)
