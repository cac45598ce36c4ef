"""The lifecycle of the ranks: a dead worker is a clear error, fast; no process outlives its LLM."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from inferlab import LLM
from inferlab.parallel import TensorParallelError
from inferlab.sampling import SamplingParams


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_killed_worker_fails_the_next_request_fast():
    llm = LLM("mqa", device="cpu", dtype="float32", tensor_parallel_size=2, num_kv_blocks=8, max_num_seqs=2)
    (pid,) = llm.executor.pids
    params = SamplingParams(max_tokens=4, temperature=0)
    assert llm.generate(["def f"], params)[0].outputs[0].token_ids
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(TensorParallelError, match="worker rank 1 exited"):
        llm.generate(["def f"], params)
    with pytest.raises(TensorParallelError, match="worker rank 1 exited"):  # and stays failed
        llm.generate(["def g"], params)
    assert time.monotonic() - t0 < 10
    llm.shutdown()
    assert not llm.llm_engine.has_unfinished_requests()


def test_a_stuck_worker_times_out_with_a_clear_error(monkeypatch):
    """A worker that stops answering (SIGSTOP: alive, but silent) is a timeout, not a hang."""
    monkeypatch.setenv("INFERLAB_TP_TIMEOUT", "3")
    llm = LLM("mqa", device="cpu", dtype="float32", tensor_parallel_size=2, num_kv_blocks=8, max_num_seqs=2)
    (pid,) = llm.executor.pids
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(TensorParallelError, match="collective failed"):
            llm.generate(["def f"], SamplingParams(max_tokens=2))
        assert time.monotonic() - t0 < 30
    finally:
        os.kill(pid, signal.SIGCONT)
        llm.shutdown()
    assert not alive(pid)


def test_refusals_at_launch_are_one_line_errors():
    with pytest.raises(TensorParallelError, match="num_attention_heads .* tensor_parallel_size=3"):
        LLM("target", device="cpu", tensor_parallel_size=3)  # 8 heads on 3 ranks
    with pytest.raises(TensorParallelError, match="speculative decoding runs with tensor_parallel_size=1"):
        LLM("target", device="cpu", tensor_parallel_size=2, speculative_config={"method": "ngram", "num_speculative_tokens": 3})


def test_a_bad_step_is_the_callers_error_and_the_ranks_stay_in_step():
    from inferlab.engine.model_runner import SeqInput
    llm = LLM("mqa", device="cpu", dtype="float32", tensor_parallel_size=2, num_kv_blocks=8, max_num_seqs=2)
    try:
        with pytest.raises(ValueError, match="block table of 1 blocks cannot hold 40 tokens"):
            llm.llm_engine.runner.execute([SeqInput(list(range(40)), 0, [0])])
        assert llm.generate(["def f"], SamplingParams(max_tokens=3, temperature=0))[0].outputs[0].token_ids
    finally:
        llm.shutdown()


def test_shutdown_leaves_no_process():
    llm = LLM("mqa", device="cpu", dtype="float32", tensor_parallel_size=2, num_kv_blocks=8, max_num_seqs=2)
    pids = llm.executor.pids
    llm.shutdown()
    llm.shutdown()  # twice is fine
    assert not any(alive(p) for p in pids)
    with pytest.raises(TensorParallelError, match="shut down"):
        llm.generate(["def f"], SamplingParams(max_tokens=2))


SCRIPT = """
import os, sys
from inferlab import LLM
llm = LLM("mqa", device="cpu", dtype="float32", tensor_parallel_size=2, num_kv_blocks=8, max_num_seqs=2)
print(llm.executor.pids[0], flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), 9)   # rank 0 dies without any cleanup
"""


@pytest.mark.slow  # a fresh interpreter and two ranks: ~12 s each
@pytest.mark.parametrize("how", ["exit", "kill"])
def test_no_orphan_when_rank0_exits(how):
    """Leaving without shutdown() (exit), or dying at once (SIGKILL): the worker goes too. The
    script comes on stdin: a spawned worker must not try to re-import the caller's main script."""
    proc = subprocess.run([sys.executable, "-", how], input=SCRIPT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == (0 if how == "exit" else -9), proc.stderr[-2000:]
    pid = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 15
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid), f"worker {pid} outlived rank 0 ({how})"


@pytest.mark.parametrize("tp, backend, words", [(1, "ray", "must be 'mp'"), (2, "uni", "needs rank processes")])
def test_a_bad_executor_backend_fails_in_one_line_before_loading(tp, backend, words):
    with pytest.raises(Exception, match=words) as e:
        LLM("target", tensor_parallel_size=tp, distributed_executor_backend=backend)
    assert "\n" not in str(e.value)
