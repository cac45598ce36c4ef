"""Offline serving throughput: the same seeded workload through continuous and static batching.

Every request of the workload arrives at once; the engine runs until all are done. Output
lengths vary (a long tail, as in chat traffic), which is what static batching handles badly:
its batch waits for its longest request while finished slots sit idle; continuous batching
(Orca, vLLM) refills them at every step. Both policies run the same scheduler code in one
process and the report gives their ratio.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from inferlab.llm import LLM
from inferlab.sampling import SamplingParams

STARTS = ["def ", "class ", "import ", "for i in range(", "if __name__ == ", "return ", "with open(",
          "    def __init__(self", "try:\n    ", "# ", "x = [", "print(", "while True:\n    ", "raise ValueError("]
WORDS = ["data", "path", "name", "value", "result", "items", "config", "buffer", "node", "count", "key", "line"]


def make_workload(num_requests: int = 64, seed: int = 0, min_tokens: int = 8, max_tokens: int = 128) -> list[dict]:
    """Seeded requests: a short code prompt each, and an output length from a long-tailed
    distribution between min_tokens and max_tokens (EOS ignored, so lengths are exact)."""
    rng = random.Random(seed)
    workload = []
    for _ in range(num_requests):
        prompt = rng.choice(STARTS) + "_".join(rng.choices(WORDS, k=rng.randint(1, 4)))
        length = min(max_tokens, min_tokens + int(rng.paretovariate(1.2) * min_tokens) - min_tokens)
        workload.append({"prompt": prompt, "max_tokens": max(min_tokens, length)})
    return workload


def run_offline(llm_kwargs: dict, workload: list[dict], llm: LLM | None = None) -> dict:
    """Run every request of ``workload`` through ``LLM(**llm_kwargs)``'s engine (or ``llm``'s);
    return throughput, latency and scheduler counters."""
    llm = llm or LLM(**llm_kwargs)
    engine = llm.llm_engine
    preempted_before = engine.num_preemptions
    steps_before = engine.counters["num_steps"]
    t0 = time.monotonic()
    for i, req in enumerate(workload):
        params = SamplingParams(temperature=0, max_tokens=req["max_tokens"], ignore_eos=True)
        engine.add_request(f"offline-{i}", req["prompt"], params, arrival_time=t0, stream=False)
    finals = []
    while engine.has_unfinished_requests():
        finals += [o for o in engine.step() if o.finished]
    elapsed = time.monotonic() - t0
    out_tokens = sum(len(o.outputs[0].token_ids) for o in finals)
    ttft = [o.metrics.first_token_time - o.metrics.arrival_time for o in finals]
    tpot = [(o.metrics.finished_time - o.metrics.first_token_time) / (len(o.outputs[0].token_ids) - 1)
            for o in finals if len(o.outputs[0].token_ids) > 1]
    latency = [o.metrics.finished_time - o.metrics.arrival_time for o in finals]
    return {"policy": engine.config.scheduler_policy, "requests": len(finals),
            "prompt_tokens": sum(len(o.prompt_token_ids) for o in finals), "output_tokens": out_tokens,
            "elapsed_s": elapsed, "output_tokens_per_s": out_tokens / elapsed, "requests_per_s": len(finals) / elapsed,
            "mean_ttft_s": statistics.fmean(ttft), "mean_tpot_s": statistics.fmean(tpot) if tpot else 0.0,
            "mean_latency_s": statistics.fmean(latency), "num_steps": engine.counters["num_steps"] - steps_before,
            "num_preemptions": engine.num_preemptions - preempted_before}


def compare_policies(model: str = "target", num_requests: int = 64, max_num_seqs: int = 16, seed: int = 0,
                     device: str | None = None) -> dict:
    """Continuous vs static batching on one seeded workload, in one process (a warm-up first)."""
    workload = make_workload(num_requests, seed)
    common = dict(model=model, device=device, max_num_seqs=max_num_seqs)
    llms = {p: LLM(**common, scheduler_policy=p) for p in ("continuous", "static")}
    run_offline({}, workload[:max_num_seqs], llm=llms["continuous"])  # warm-up
    runs = {p: run_offline({}, workload, llm=llm) for p, llm in llms.items()}
    ratio = runs["continuous"]["output_tokens_per_s"] / runs["static"]["output_tokens_per_s"]
    return {"model": model, "num_requests": num_requests, "max_num_seqs": max_num_seqs, "seed": seed,
            "continuous": runs["continuous"], "static": runs["static"], "throughput_ratio": ratio}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="inferlab bench serve", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="target")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.num_requests < 1 or args.max_num_seqs < 1:
        p.error("--num-requests and --max-num-seqs must be >= 1")
    r = compare_policies(args.model, args.num_requests, args.max_num_seqs, args.seed, args.device)
    if args.json:
        print(json.dumps(r, default=lambda v: round(v, 4)))
        return 0
    print(f"{r['num_requests']} requests, max_num_seqs {r['max_num_seqs']}, seed {r['seed']} ({r['model']})")
    print(f"{'policy':<12}{'tokens/s':>10}{'req/s':>8}{'TTFT s':>8}{'TPOT ms':>9}{'steps':>7}")
    for name in ("continuous", "static"):
        x = r[name]
        print(f"{name:<12}{x['output_tokens_per_s']:>10.1f}{x['requests_per_s']:>8.2f}{x['mean_ttft_s']:>8.2f}"
              f"{x['mean_tpot_s'] * 1e3:>9.2f}{x['num_steps']:>7}")
    print(f"continuous / static throughput: {r['throughput_ratio']:.2f}x")
    return 0
