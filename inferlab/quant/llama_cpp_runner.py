"""Run llama.cpp (llama-cpp-python) on a .gguf file in a child process.

A llama.cpp built for another CPU (``-march=native`` on a machine whose advertised instructions
the hypervisor does not execute) dies with SIGILL; in a child process that is a clear error for
the caller, not the end of the test session or the benchmark.
"""
from __future__ import annotations

import json
import subprocess
import sys

_SCRIPT = r"""
import json, math, sys, time
import numpy as np
import llama_cpp
path, ids, new_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
llm = llama_cpp.Llama(path, n_ctx=max(512, len(ids) + new_tokens), n_batch=512, logits_all=True,
                      n_threads=1, verbose=False)
out = {}
if new_tokens == 0:  # negative log-likelihood of ids[1:] given the prefix
    llm.eval(ids)
    logits = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    out["nll"] = float(-logp[np.arange(len(ids) - 1), ids[1:]].mean())
else:  # greedy decode speed, best of three
    best = 0.0
    for _ in range(3):
        llm.reset()
        llm.eval(ids)
        t = time.perf_counter()
        for _ in range(new_tokens):
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
        best = max(best, new_tokens / (time.perf_counter() - t))
    out["tokens_per_s"] = best
print(json.dumps(out))
"""


class LlamaCppError(RuntimeError):
    pass


def run(path, ids: list[int], new_tokens: int = 0, timeout: float = 600) -> dict:
    """``new_tokens`` = 0: {"nll"} of ``ids``; otherwise {"tokens_per_s"} of a greedy decode."""
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(path), json.dumps([int(i) for i in ids]),
                           str(new_tokens)], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        signal = -proc.returncode if proc.returncode < 0 else None
        why = "SIGILL: this llama.cpp build uses instructions this CPU does not run; reinstall it with " \
              "CMAKE_ARGS=-DGGML_NATIVE=OFF" if signal == 4 else (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise LlamaCppError(f"llama.cpp failed ({why})")
    return json.loads(proc.stdout.strip().splitlines()[-1])
