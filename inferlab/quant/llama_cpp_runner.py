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
import json, math, os, sys, time
import numpy as np
import llama_cpp
path, new_tokens = sys.argv[1], int(sys.argv[2])
ids = json.loads(sys.stdin.read())  # on stdin: a long prompt does not fit in an argument list
if new_tokens == -1:  # ids is a list of strings: llama.cpp's own tokenization of each (no BOS added)
    llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    print(json.dumps({"ids": [llm.tokenize(t.encode(), add_bos=False, special=True) for t in ids]}))
    sys.exit(0)
skips = None
if isinstance(ids, dict):  # {"spans": [...], "skip": [...]}: score span i from position skip[i] on
    ids, skips = ids["spans"], ids["skip"]
spans = ids if ids and isinstance(ids[0], list) else [ids]
skips = skips or [0] * len(spans)
llm = llama_cpp.Llama(path, n_ctx=max(512, max(map(len, spans)) + new_tokens), n_batch=512, logits_all=True,
                      n_threads=int(os.environ.get("INFERLAB_LLAMA_CPP_THREADS", "1")), verbose=False)
out = {}
if new_tokens == 0:  # negative log-likelihood of each span's ids[1:] given its prefix, and the argmax
    total, count, argmax = 0.0, 0, []
    for span, skip in zip(spans, skips):
        llm.reset()
        llm.eval(span)
        logits = np.asarray(llm.scores[: len(span)], dtype=np.float64)[skip:-1]  # row j predicts token j + 1
        logits -= logits.max(-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        total += float(-logp[np.arange(len(logits)), span[skip + 1:]].sum())
        count += len(logits)
        argmax.append(logits.argmax(-1).tolist())
    out.update(nll=total / count, tokens=count, argmax=argmax if len(spans) > 1 else argmax[0])
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


def run(path, ids: list[int] | list[list[int]], new_tokens: int = 0, timeout: float = 600,
        threads: int | None = None) -> dict:
    """``new_tokens`` = 0: {"nll" (mean over the scored tokens), "tokens", "argmax"} of ``ids``, or of
    each span of a list of spans (each scored from its own start, ``argmax`` then one list per span);
    otherwise {"tokens_per_s"} of a greedy decode. ``threads``: llama.cpp's (default 1, or
    ``INFERLAB_LLAMA_CPP_THREADS``)."""
    ids = [[int(i) for i in span] for span in ids] if ids and isinstance(ids[0], (list, tuple)) else [int(i) for i in ids]
    return _call(path, ids, new_tokens, timeout, threads)


def score_windows(path, ids, windows: list[tuple[int, int, int]], timeout: float = 3600) -> dict:
    """{"nll", "tokens", "argmax"} of the sliding windows of ``inferlab.eval.ppl.windows`` (begin, end,
    first scored): each window read from its start, only its tokens from ``first`` on scored, the
    same positions ``inferlab.eval.ppl.evaluate`` scores."""
    ids = [int(i) for i in ids]
    payload = {"spans": [ids[b:e] for b, e, _ in windows], "skip": [first - b - 1 for b, _, first in windows]}
    return _call(path, payload, 0, timeout)


def tokenize(path, texts: list[str], timeout: float = 120) -> list[list[int]]:
    """llama.cpp's token ids for each text (special tokens parsed, no BOS added)."""
    return _call(path, list(texts), -1, timeout)["ids"]


def _call(path, payload, new_tokens: int, timeout: float, threads: int | None = None) -> dict:
    env = dict(os.environ, **({"INFERLAB_LLAMA_CPP_THREADS": str(threads)} if threads else {}))
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(path), str(new_tokens)], input=json.dumps(payload),
                          capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        signal = -proc.returncode if proc.returncode < 0 else None
        why = "SIGILL: this llama.cpp build uses instructions this CPU does not run; reinstall it with " \
              "CMAKE_ARGS=-DGGML_NATIVE=OFF" if signal == 4 else (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise LlamaCppError(f"llama.cpp failed ({why})")
    return json.loads(proc.stdout.strip().splitlines()[-1])
