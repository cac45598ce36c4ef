"""Background precompute on the engine's priority scheduling (the small embedded model)."""
import numpy as np
import pytest

from inferlab.engine import EngineConfig, LLMEngine
from inferlab.model.loader import load_checkpoint
from inferlab.sampling import SamplingParams
from inferlab.strategy import priority as P


@pytest.fixture(scope="module")
def model():
    return load_checkpoint("mha", device="cpu")


def engine(model, **knobs):
    return LLMEngine(*model, EngineConfig(**{"block_size": 4, "scheduling_policy": "priority", **knobs}))


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
    base = P.run(alone, interactive_load())

    busy = engine(model, **KNOBS)
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


def test_waiting_interactive_preempts_a_running_job(model):
    e = engine(model, num_kv_blocks=40, max_num_seqs=2)
    for j in range(2):
        e.add_request(f"job{j}", list(range(10, 30)), params(40), priority=P.BACKGROUND)
    e.step()
    assert e.num_running == 2
    e.add_request("user", list(range(50, 60)), params(3), priority=P.INTERACTIVE)
    e.step()
    running = [s.request_id for s in e.scheduler.running]
    assert "user" in running and e.num_preemptions == 1 and running.count("job0") == 1  # the newest job left


def test_a_job_preempted_for_a_running_request_does_not_delay_admissions(model):
    e = engine(model, num_kv_blocks=12, max_num_seqs=4)
    e.add_request("user0", list(range(10, 18)), params(5))           # 2 blocks; its first decode needs a 3rd
    for j in range(2):
        e.add_request(f"job{j}", list(range(20, 40)), params(20), priority=P.BACKGROUND)  # 5 blocks each: pool full
    e.step()
    assert e.block_manager.num_free_blocks == 0
    e.add_request("user1", list(range(50, 58)), params(3))
    e.step()                                   # user0 grows (job1 preempted), then user1 is admitted at once
    running = [s.request_id for s in e.scheduler.running]
    assert running == ["user0", "user1", "job0"]    # job1 was preempted; user1 did not wait a step (queue in priority order)


def test_precomputed_answer_equals_the_interactive_one(model):
    e = engine(model)
    pre = P.Precompute()
    prompt = list(range(30, 50))
    P.run(e, {0: [pre.job("daily", prompt, params(16)), ("now", prompt, params(16), P.INTERACTIVE)]},
          on_output=lambda out: (pre.on_output(out), outs.__setitem__(out.request_id, out)))
    assert pre.serve("daily") == outs["now"].outputs[0].text and pre.serve("other") is None


outs = {}


def test_a_background_job_needs_the_priority_policy(model):
    e = LLMEngine(*model, EngineConfig(block_size=4))  # "fcfs"
    with pytest.raises(ValueError, match="scheduling_policy='priority'"):
        P.run(e, {0: [P.Precompute().job("daily", [1, 2, 3], params(2))]})
    assert not e.has_unfinished_requests()
