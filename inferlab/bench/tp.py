"""Tensor parallelism on this machine: decode step time at TP=1 and TP=2, the all-reduces each
step makes (count, time, bytes), and each rank's peak memory while loading.

Both engines run in this process (rank 0) on the same prompts, greedy, alternating, best of
``--repeats``, one thread per rank (two ranks spinning two thread pools on two cores measure
the contention, not the parallelism). The all-reduce counters are rank 0's (its runner's ``comm.stats``), split by
step kind with the engine's step hook, so the decode rows hold decode steps only.

What to expect here: a 2-core CPU and gloo over localhost TCP. One small all-reduce costs about a
millisecond, a decode step of the embedded target makes 2 x layers + 1 of them, and two ranks
share two cores with everything else: TP=2 is *slower* here. TP on these machines teaches
correctness; it pays where a model does not fit one device, or where the interconnect is fast
(NVLink moves ~900 GB/s: a decode all-reduce of a few KB costs microseconds there).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

_MEMORY = """
import json, os, resource, sys, torch
def vm_rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) * 1024
def rss():
    f = dict(l.split(":", 1) for l in open("/proc/self/status") if l.startswith(("RssAnon", "RssFile")))
    return {k: int(v.split()[0]) * 1024 for k, v in f.items()}
from inferlab.model.loader import load_checkpoint, resolve_model_path
from inferlab.parallel.loader import load_shard
name, rank, world = str(resolve_model_path(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
torch.ones(8).clone().sum()  # the copy kernels' code pages, touched before the baseline
base = vm_rss()  # now, imports done
base_split = rss()
if world == 0:
    model = load_checkpoint(name, device="cpu", dtype=torch.float32)[0]
else:
    model = load_shard(name, rank, world, device="cpu", dtype=torch.float32)[0]
tensors = {id(p): p for p in model.state_dict().values()}.values()
assert all(torch.isfinite(t.float().sum()) for t in tensors)  # read every byte held: mapped pages count once read
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
held = sum(t.numel() * t.element_size() for t in tensors)
print(json.dumps({"weights_bytes": held, "peak_rss_growth_bytes": peak - base,
                  "rss_growth_bytes": vm_rss() - base,
                  **{k: v - base_split[k] for k, v in rss().items()}}))
"""


def load_memory(model: str, world: int) -> list[dict]:
    """Each rank's load in a fresh interpreter: the bytes it holds, and how much its peak RSS grew
    (file pages read through the memory map count in RSS too)."""
    rows = []
    for label, rank, w in [("load_checkpoint (TP=1)", 0, 0)] + [(f"load_shard rank {r} of {world}", r, world)
                                                                for r in range(world)]:
        out = subprocess.run([sys.executable, "-c", _MEMORY, model, str(rank), str(w)], capture_output=True,
                             text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append({"load": label, "weights_mb": round(r["weights_bytes"] / 2**20, 1),
                     "peak_rss_growth_mb": round(r["peak_rss_growth_bytes"] / 2**20, 1),
                     "rss_growth_after_load_mb": round(r["rss_growth_bytes"] / 2**20, 1),
                     "anon_growth_mb": round(r["RssAnon"] / 2**20, 1),
                     "file_pages_growth_mb": round(r["RssFile"] / 2**20, 1)})
    return rows


def _engine_run(llm, prompts, new_tokens: int) -> dict:
    """One greedy batch; returns decode-only totals: steps, seconds, all-reduces and their bytes."""
    from inferlab.bench.stats import is_decode_step
    from inferlab.parallel.comm import CollectiveStats
    from inferlab.sampling import SamplingParams

    totals = {"steps": 0, "s": 0.0, "all_reduce": 0, "all_reduce_s": 0.0, "all_reduce_bytes": 0,
              "all_gather": 0, "all_gather_s": 0.0}
    comm = getattr(llm.llm_engine.runner, "comm", None)  # TP=1 has none: no collectives, zero counts

    def counters() -> dict:
        return (comm.stats if comm is not None else CollectiveStats()).as_dict()

    last = counters()

    def hook(engine, record):
        nonlocal last
        now = counters()
        if record["scheduled"] and is_decode_step(record):
            totals["steps"] += 1
            totals["s"] += record["seconds"]
            for k in ("all_reduce", "all_reduce_s", "all_reduce_bytes", "all_gather", "all_gather_s"):
                totals[k] += now[k] - last[k]
        last = now

    llm.llm_engine.step_hooks.append(hook)
    try:
        llm.generate(prompt_token_ids=prompts,
                     sampling_params=SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True))
    finally:
        llm.llm_engine.step_hooks.remove(hook)
    return totals


def run(model: str = "target", batch: int = 4, context: int = 32, new_tokens: int = 32, repeats: int = 3,
        world: int = 2, memory_model: str | None = "random-80m") -> dict:
    import torch

    from inferlab.llm import LLM

    blocks = batch * -(-(context + new_tokens) // 16)
    knobs = dict(device="cpu", dtype="float32", max_num_seqs=batch, num_kv_blocks=blocks)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, 4000, (batch, context), generator=gen).tolist()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread per rank (the workers take cores // world): no rank starves another
    engines = {1: LLM(model, **knobs), world: LLM(model, tensor_parallel_size=world, **knobs)}
    try:
        for llm in engines.values():
            _engine_run(llm, prompts, 4)  # warm-up
        best = {}
        for _ in range(repeats):
            for w, llm in engines.items():
                t = _engine_run(llm, prompts, new_tokens)
                if w not in best or t["s"] < best[w]["s"]:
                    best[w] = t
    finally:
        engines[world].shutdown()
        torch.set_num_threads(threads)
    cfg = engines[1].model.config
    rows = []
    for w, t in best.items():
        steps = max(t["steps"], 1)
        rows.append({"tensor_parallel_size": w, "decode_step_ms": round(1e3 * t["s"] / steps, 2),
                     "step_time_vs_tp1": round(t["s"] / steps / (best[1]["s"] / max(best[1]["steps"], 1)), 2),
                     "all_reduces_per_step": round(t["all_reduce"] / steps, 1),
                     "all_reduce_ms_per_step": round(1e3 * t["all_reduce_s"] / steps, 2),
                     "ms_per_all_reduce": round(1e3 * t["all_reduce_s"] / max(t["all_reduce"], 1), 3),
                     "bytes_per_all_reduce": t["all_reduce_bytes"] // max(t["all_reduce"], 1),
                     "all_reduce_share_of_step": round(t["all_reduce_s"] / t["s"], 3) if t["s"] else 0.0,
                     "all_gathers_per_step": round(t["all_gather"] / steps, 1)})
    out = {"model": model, "batch": batch, "context": context, "new_tokens": new_tokens,
           "num_hidden_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size,
           "expected_all_reduces_per_step": 2 * cfg.num_hidden_layers + 1,
           "expected_bytes_per_decode_all_reduce": batch * cfg.hidden_size * 4,
           "rows": rows,
           "note": "2 CPU cores and gloo over TCP: TP teaches correctness here, not speed "
                   "(one small all-reduce costs ~1 ms; on NVLink a few microseconds)"}
    if memory_model:
        out["memory_model"] = memory_model
        out["load_memory"] = load_memory(memory_model, world)
    return out


def main(argv: list[str]) -> int:
    from inferlab.cli import HelpFormatter

    p = argparse.ArgumentParser(formatter_class=HelpFormatter, prog="inferlab bench tp",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model", default="target", help="model to decode with (default: target)")
    p.add_argument("--tensor-parallel-size", type=int, default=2, help="ranks of the TP row (default: 2)")
    p.add_argument("--batch", type=int, default=4, help="sequences decoded together (default: 4)")
    p.add_argument("--context", type=int, default=32, help="prompt tokens per sequence (default: 32)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens decoded per timing (default: 32)")
    p.add_argument("--repeats", type=int, default=3, help="timings per engine, best kept (default: 3)")
    p.add_argument("--memory-model", default="random-80m",
                   help="model whose per-rank load memory is measured; 'none' skips it (default: random-80m)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if min(args.batch, args.context, args.new_tokens, args.repeats) < 1 or args.tensor_parallel_size < 2:
        p.error("--batch, --context, --new-tokens and --repeats must be positive, --tensor-parallel-size >= 2")
    r = run(args.model, args.batch, args.context, args.new_tokens, args.repeats, args.tensor_parallel_size,
            None if args.memory_model == "none" else args.memory_model)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"{r['model']}: batch {r['batch']}, {r['new_tokens']} decode steps, best of {args.repeats}")
    keys = list(r["rows"][0])
    print("  ".join(keys))
    for row in r["rows"]:
        print("  ".join(str(row[k]).rjust(len(k)) for k in keys))
    for row in r.get("load_memory", []):
        print(f"{row['load']:<28} weights {row['weights_mb']:>7} MB   "
              f"peak RSS growth {row['peak_rss_growth_mb']:>7} MB")
    print(r["note"])
    return 0
