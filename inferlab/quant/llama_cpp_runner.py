"""Run llama.cpp (llama-cpp-python) on a .gguf file in a child process.

A llama.cpp built for another CPU (``-march=native`` on a machine whose advertised instructions
the hypervisor does not execute) dies with SIGILL; in a child process that is a clear error for
the caller, not the end of the test session or the benchmark.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

_SCRIPT = r"""
import json, os, sys, time
import numpy as np
import llama_cpp
path, job = sys.argv[1], json.loads(sys.stdin.read())  # on stdin: long prompts do not fit in an argument list
if "texts" in job:  # llama.cpp's own tokenization of each text (special tokens parsed, no BOS added)
    llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    print(json.dumps({"ids": [llm.tokenize(t.encode(), add_bos=False, special=True) for t in job["texts"]]}))
    sys.exit(0)
spans, new_tokens = job.get("spans") or [job["ids"]], job.get("new_tokens", 0)
llm = llama_cpp.Llama(path, n_ctx=max(512, max(map(len, spans)) + new_tokens), n_batch=512, logits_all=True,
                      n_threads=int(os.environ.get("INFERLAB_LLAMA_CPP_THREADS", "1")), verbose=False)
out = {}
if "spans" in job:  # negative log-likelihood of each span's tokens after position skip, and the argmax
    total, count, argmax = 0.0, 0, []
    for span, skip in zip(spans, job["skip"]):
        llm.reset()
        llm.eval(span)
        logits = np.asarray(llm.scores[: len(span)], dtype=np.float64)[skip:-1]  # row j predicts token j + 1
        logits -= logits.max(-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        total += float(-logp[np.arange(len(logits)), span[skip + 1:]].sum())
        count += len(logits)
        argmax.append(logits.argmax(-1).tolist())
    out.update(nll=total / count, tokens=count, argmax=argmax)
else:  # greedy decode speed, best of three
    best = 0.0
    for _ in range(3):
        llm.reset()
        llm.eval(job["ids"])
        t = time.perf_counter()
        for _ in range(new_tokens):
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
        best = max(best, new_tokens / (time.perf_counter() - t))
    out["tokens_per_s"] = best
print(json.dumps(out))
"""


class LlamaCppError(RuntimeError):
    pass


def run(path, ids: list[int], new_tokens: int = 0, timeout: float = 600, threads: int | None = None) -> dict:
    """``new_tokens`` = 0: {"nll" (mean over ``ids[1:]``), "tokens", "argmax"} of ``ids``; otherwise
    {"tokens_per_s"} of a greedy decode after them. ``threads``: llama.cpp's (default 1, or
    ``INFERLAB_LLAMA_CPP_THREADS``)."""
    ids = [int(i) for i in ids]
    if new_tokens == 0:
        out = score_windows(path, ids, [(0, len(ids), 1)], timeout, threads)
        return {**out, "argmax": out["argmax"][0]}
    return _call(path, {"ids": ids, "new_tokens": new_tokens}, timeout, threads)


def score_windows(path, ids, windows: list[tuple[int, int, int]], timeout: float = 3600,
                  threads: int | None = None) -> dict:
    """{"nll", "tokens", "argmax" (one list per window)} of the sliding windows of
    ``inferlab.eval.ppl.windows`` (begin, end, first scored): each window read from its start, only
    its tokens from ``first`` on scored, the same positions ``inferlab.eval.ppl.evaluate`` scores."""
    ids = [int(i) for i in ids]
    job = {"spans": [ids[b:e] for b, e, _ in windows], "skip": [first - b - 1 for b, _, first in windows]}
    return _call(path, job, timeout, threads)


def tokenize(path, texts: list[str], timeout: float = 120) -> list[list[int]]:
    """llama.cpp's token ids for each text (special tokens parsed, no BOS added)."""
    return _call(path, {"texts": list(texts)}, timeout)["ids"]


def _call(path, job: dict, timeout: float, threads: int | None = None) -> dict:
    env = dict(os.environ, **({"INFERLAB_LLAMA_CPP_THREADS": str(threads)} if threads else {}))
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(path)], input=json.dumps(job),
                          capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        signal = -proc.returncode if proc.returncode < 0 else None
        why = "SIGILL: this llama.cpp build uses instructions this CPU does not run; reinstall it with " \
              "CMAKE_ARGS=-DGGML_NATIVE=OFF" if signal == 4 else (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise LlamaCppError(f"llama.cpp failed ({why})")
    return json.loads(proc.stdout.strip().splitlines()[-1])
