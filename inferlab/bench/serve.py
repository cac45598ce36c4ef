"""Serving throughput: one seeded workload through continuous and static batching, or any server.

The workload looks like chat traffic: requests arrive as a Poisson process (``--request-rate``
per second), prompt and output lengths are lognormal (most short, a long tail), and some prompts
start with one of a few shared system prompts (what prefix caching reuses). Output lengths vary,
which is what static batching handles badly: its batch waits for its longest request while
finished slots sit idle; continuous batching (Orca, vLLM) refills them at every step. Both
policies run the same scheduler code in one process and the report gives their ratio, with the
continuous run's latencies (TTFT, TPOT), preemptions, prefix-cache hit rate and any KV blocks
still held after every request finished (leaked).

Fewer steps turn into more tokens/s only as far as a step's cost is fixed: the report gives the
step ratio beside the tokens/s ratio, and fits every step's time to a fixed part, a part per
sequence and a part per prompt token (``step_costs``). ``--model target,random-80m`` adds a row
for a model large enough that reading its weights dominates a step, as on a real deployment.

That first comparison gives both policies the same ``max_num_seqs`` (the scheduling gain alone).
The second (``kv_budget.py``) gives every system the same KV memory instead, as the vLLM paper does
(Fig. 12-13): static batches that reserve ``max_model_len`` (Orca-Max) or the next power of two
(Orca-Pow2) per request against paged continuous batching (vLLM), on ShareGPT-shaped lengths
scaled down by 8, with the average batch each system reached beside its tokens/s.

With ``--url http://HOST:PORT`` the same workload is sent instead to a running OpenAI-compatible
server (``inferlab serve``, vLLM, SGLang) and timed from the client (``serve_client.py``).
"""
from __future__ import annotations

import argparse
import json
import math
import random

import torch

from inferlab.bench.offline import run_offline
from inferlab.bench.stats import decode_step_seconds, mean_decode_batch, step_costs
from inferlab.cli import HelpFormatter, add_quantization_argument
from inferlab.llm import LLM

STARTS = ["def ", "class ", "import ", "for i in range(", "if __name__ == ", "return ", "with open(",
          "    def __init__(self", "try:\n    ", "# ", "x = [", "print(", "while True:\n    ", "raise ValueError("]
WORDS = ["data", "path", "name", "value", "result", "items", "config", "buffer", "node", "count", "key", "line"]


def system_prompts(k: int, rng: random.Random) -> list[str]:
    """``k`` module headers of 12-24 lines each: the shared prefixes of the workload."""
    heads = []
    for j in range(k):
        lines = [f'"""Helpers for {rng.choice(WORDS)} {rng.choice(WORDS)} handling ({j})."""']
        for _ in range(rng.randint(12, 24)):
            a, b = rng.sample(WORDS, 2)
            lines.append(rng.choice([f"import {a}", f"from {a} import {b}", f"{a.upper()}_{b.upper()} = {rng.randint(0, 99)}"]))
        heads.append("\n".join(lines) + "\n\n")
    return heads


def make_workload(num_requests: int = 64, seed: int = 0, min_tokens: int = 8, max_tokens: int = 128,
                  request_rate: float = float("inf"), shared_fraction: float = 0.5,
                  num_system_prompts: int = 4) -> list[dict]:
    """Seeded requests ``{"prompt", "max_tokens", "arrival_s"}``: a code prompt of lognormal length
    (``shared_fraction`` of them behind one of ``num_system_prompts`` shared headers), an output
    length from a lognormal between min_tokens and max_tokens (EOS ignored, so lengths are exact),
    and Poisson arrivals at ``request_rate`` per second (inf: all at time 0)."""
    rng = random.Random(seed)
    heads = system_prompts(num_system_prompts, rng)
    median = max(min_tokens, (max_tokens * min_tokens) ** 0.5 / 2)  # long tail up to max_tokens
    workload, t = [], 0.0
    for _ in range(num_requests):
        words = min(40, max(1, round(rng.lognormvariate(1.0, 0.8))))
        prompt = rng.choice(STARTS) + "_".join(rng.choices(WORDS, k=words))
        if heads and rng.random() < shared_fraction:
            prompt = rng.choice(heads) + prompt
        length = round(rng.lognormvariate(math.log(median), 1.0))
        if request_rate != float("inf"):
            t += rng.expovariate(request_rate)
        workload.append({"prompt": prompt, "max_tokens": min(max_tokens, max(min_tokens, length)), "arrival_s": t})
    return workload


def compare_policies(model: str = "target", num_requests: int = 64, max_num_seqs: int = 16, seed: int = 0,
                     device: str | None = None, request_rate: float = float("inf"),
                     enable_prefix_caching: bool = True, repeats: int = 3, num_kv_blocks: int | None = None,
                     quantization: str | None = None) -> dict:
    """Continuous vs static batching on one seeded workload, in one process, alternating, best of
    ``repeats`` each. Every run gets a fresh engine (a cold prefix cache) and a warm-up first;
    ``quantization`` is ``LLM``'s."""
    workload = make_workload(num_requests, seed, request_rate=request_rate)
    warm = make_workload(max_num_seqs, seed + 1, max_tokens=16, num_system_prompts=0)
    common = dict(model=model, device=device, max_num_seqs=max_num_seqs, enable_prefix_caching=enable_prefix_caching,
                  num_kv_blocks=num_kv_blocks, quantization=quantization)
    runs: dict[str, dict] = {}
    completed, leaked = num_requests, 0  # over every run, not only the best ones
    for _ in range(repeats):
        for policy in ("continuous", "static"):
            llm = LLM(**common, batching_policy=policy)
            run_offline({}, warm, llm=llm)
            run = run_offline({}, workload, llm=llm)
            completed, leaked = min(completed, run["requests"]), leaked + run["leaked_blocks"]
            if policy not in runs or run["output_tokens_per_s"] > runs[policy]["output_tokens_per_s"]:
                runs[policy] = run
    c, st = runs["continuous"], runs["static"]
    tokens_ratio = c["output_tokens_per_s"] / st["output_tokens_per_s"]
    step_ratio = st["num_steps"] / c["num_steps"]  # the scheduling gain, free of per-step cost
    records = c["records"] + st["records"]
    return {"requests": num_requests, "completed": completed,
            "static_tokens_per_s": st["output_tokens_per_s"], "continuous_tokens_per_s": c["output_tokens_per_s"],
            "continuous_over_static_tokens_per_s": tokens_ratio,
            "continuous_mean_batch": mean_decode_batch(c["records"]), "static_mean_batch": mean_decode_batch(st["records"]), "static_over_continuous_steps": step_ratio,
            "tokens_ratio_over_step_ratio": tokens_ratio / step_ratio,
            "ttft_p50_s": c["ttft_p50_s"], "ttft_p99_s": c["ttft_p99_s"], "tpot_p50_s": c["tpot_p50_s"],
            "preemptions": c["num_preemptions"], "prefix_hit_rate": c["prefix_hit_rate"],
            "leaked_blocks": leaked,
            "step_costs": step_costs(records), "decode_step_s": decode_step_seconds(records),
            "threads": torch.get_num_threads(),
            "model": model, "quantization": quantization, "max_num_seqs": max_num_seqs, "seed": seed, "request_rate": request_rate,
            "repeats": repeats,
            "continuous": c, "static": st}


#: The goals the report checks at the same max_num_seqs: continuous over static tokens/s, and that
#: ratio over the step ratio (under the same KV memory: ``kv_budget.GOAL``).
GOALS = {"continuous_over_static_tokens_per_s": 2.0, "tokens_ratio_over_step_ratio": 0.8}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="inferlab bench serve", description=__doc__.splitlines()[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--model", default="target", help="offline: the model to load, or several, comma-separated "
                   "(random-80m: random weights of a realistic shape, for timing); --url: the served name "
                   "(default: the first the server lists)")
    p.add_argument("--url", default=None, help="benchmark the OpenAI-compatible server at http://HOST:PORT instead")
    p.add_argument("--num-requests", type=int, default=64, help="requests in the workload")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="Poisson arrivals per second (default inf: all at once)")
    p.add_argument("--max-num-seqs", type=int, default=16, help="offline: sequences one engine step may run")
    p.add_argument("--num-kv-blocks", type=int, default=None, help="offline: a smaller KV pool preempts more")
    p.add_argument("--no-prefix-caching", action="store_true", help="offline: turn the prefix cache off")
    p.add_argument("--repeats", type=int, default=3, help="offline: best of this many runs per policy")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload (prompts, lengths, arrivals)")
    p.add_argument("--device", default=None, help="offline: cpu or cuda (default: cuda when available)")
    p.add_argument("--compare", choices=("both", "slots", "memory"), default="both",
                   help="offline: slots: the same max_num_seqs for both policies; memory: the same KV memory for "
                        "Orca-Max, Orca-Pow2 and vLLM (ShareGPT lengths / 8); both")
    p.add_argument("--kv-budget-tokens", type=int, default=None,
                   help="offline, memory: the KV budget in tokens (default: 16 sequences of the workload's mean "
                        "length in whole blocks, 1024)")
    p.add_argument("--kv-budget-mb", type=float, default=None,
                   help="offline, memory: the KV budget in MB (10^6 bytes) of fp32 K and V, instead")
    p.add_argument("--memory-requests", type=int, default=None,
                   help="offline, memory: requests in the ShareGPT-shaped workload (default: --num-requests)")
    add_quantization_argument(p, "offline: ")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.num_requests < 1 or args.max_num_seqs < 1 or args.repeats < 1:
        p.error("--num-requests, --max-num-seqs and --repeats must be >= 1")
    if not args.request_rate > 0:
        p.error("--request-rate must be > 0 (inf: all at once)")
    if args.url is not None:
        return _main_url(args, p)
    models = [m.strip() for m in args.model.split(",") if m.strip()]
    if not models:
        p.error("--model needs at least one model name")
    if args.kv_budget_tokens is not None and args.kv_budget_mb is not None:
        p.error("give the KV budget once: --kv-budget-tokens or --kv-budget-mb")
    reports = []
    for m in models:
        r = {"model": m}
        if args.compare in ("both", "slots"):
            r = compare_policies(m, args.num_requests, args.max_num_seqs, args.seed, args.device, args.request_rate,
                                 not args.no_prefix_caching, args.repeats, args.num_kv_blocks, args.quantization)
        if args.compare in ("both", "memory"):
            r["same_memory"] = _same_memory(m, args, p)
        reports.append(r)
    if args.json:
        clean = [_without_records(r) for r in reports]
        print(json.dumps(_rounded(clean[0] if len(clean) == 1 else {"models": clean})))
        return 0
    if args.compare in ("both", "slots"):
        _print_slots(reports)
    if args.compare in ("both", "memory"):
        for r in reports:
            _print_memory(r["same_memory"])
    return 0


def _same_memory(model: str, args, p) -> dict:
    """The same-KV-memory comparison for ``model``, its budget from the flags (MB through the model's KV bytes per token)."""
    from inferlab.bench.kv_budget import compare_memory, model_config
    from inferlab.model.gqa import kv_bytes_per_token

    budget = args.kv_budget_tokens
    if args.kv_budget_mb is not None:
        budget = int(args.kv_budget_mb * 1e6 // kv_bytes_per_token(model_config(model), bytes_per_value=4))
    try:
        return compare_memory(model, args.memory_requests or args.num_requests, args.seed, budget,
                              min(args.repeats, 2), args.device, quantization=args.quantization)
    except ValueError as e:
        p.error(str(e))


def _weights(quantization: str | None) -> str:
    """How a report names the weights it timed: ``--quantization``'s method, none (fp32), or the model's own."""
    return {None: "as stored", "none": "fp32"}.get(quantization, quantization)


def _print_memory(m: dict) -> None:
    w = m["workload"]
    print(f"same KV memory: {m['kv_budget_tokens']} tokens ({m['kv_budget_mb']:.1f} MB at "
          f"{m['kv_bytes_per_token'] / 1e3:.1f} kB per token), {m['requests']} requests of ShareGPT lengths divided by "
          f"{m['scale']} (mean {w['mean_prompt_tokens']:.0f} in / {w['mean_output_tokens']:.0f} out, max_model_len "
          f"{w['max_model_len']}), weights {_weights(m['quantization'])}, best of {m['repeats']}")
    print(f"{'model':<12}{'system':<11}{'reserves':<19}{'tokens/s':>10}{'vLLM is':>9}{'batch':>7}{'formed':>8}"
          f"{'steps':>7}{'preempt':>8}")
    v = m["systems"]["vLLM"]
    for name, x in m["systems"].items():
        ratio = f"{v['over_' + name]:.2f}x" if name != "vLLM" else "1.00x"
        formed = f"{x['mean_batch_formed']:.1f}" if x["mean_batch_formed"] is not None else "-"
        print(f"{m['model']:<12}{name:<11}{x['reservation']:<19}{x['output_tokens_per_s']:>10.1f}{ratio:>9}"
              f"{x['mean_batch']:>7.1f}{formed:>8}{x['num_steps']:>7}{x['preemptions']:>8}")
    print(f"  (batch: sequences decoding per step; formed: sequences per static batch; Orca-Max fits "
          f"{m['max_sequences_orca_max']})")
    d = m["decode_step_s"]
    print("  decode step ms by batch (all three systems' steps): " + ", ".join(f"{b}: {t * 1e3:.1f}" for b, t in d.items()
                                                                  if b <= 16 or b in (32, 64, 128, 256)))
    o = m["systems"]["Orca-Max"]
    print(f"  steps with a prompt: {v['prompt_share']:.0%} of vLLM's step time ({v['prompt_tokens_computed']} prompt "
          f"tokens computed, {v['prompt_tokens_computed'] - w['prompt_tokens']} of them recomputed after preemption), "
          f"{o['prompt_share']:.0%} of Orca-Max's; decode steps alone: vLLM {v['decode_steps_over_Orca-Max']:.2f}x "
          "Orca-Max's tokens/s")
    held = "met" if m["goal_met"] else "MISSED"
    print(f"  goal vLLM / Orca-Max tokens/s >= {m['goal_vllm_over_orca_max']}: {m['vllm_over_orca_max']:.2f} {held}")


def _print_slots(reports: list[dict]) -> None:
    r = reports[0]
    print(f"{r['requests']} requests, max_num_seqs {r['max_num_seqs']}, seed {r['seed']}, rate {r['request_rate']}/s, "
          f"weights {_weights(r['quantization'])}, best of {r['repeats']}, {r['threads']} threads")
    print(f"{'model':<12}{'policy':<12}{'tokens/s':>10}{'req/s':>8}{'TTFT p50':>10}{'TPOT ms':>9}{'steps':>7}{'batch':>7}")
    for r in reports:
        for name in ("continuous", "static"):
            x = r[name]
            print(f"{r['model']:<12}{name:<12}{x['output_tokens_per_s']:>10.1f}{x['requests_per_s']:>8.2f}"
                  f"{x['ttft_p50_s']:>10.3f}{x['tpot_p50_s'] * 1e3:>9.2f}{x['num_steps']:>7}"
                  f"{r[name + '_mean_batch']:>7.1f}")
    for r in reports:
        print(f"{r['model']}: continuous / static throughput {r['continuous_over_static_tokens_per_s']:.2f}x "
              f"({r['static_over_continuous_steps']:.2f}x fewer steps: the tokens/s ratio is "
              f"{r['tokens_ratio_over_step_ratio']:.2f} of the step ratio); completed {r['completed']}/{r['requests']}, "
              f"preemptions {r['preemptions']}, prefix hit rate {r['prefix_hit_rate']:.2f}, leaked blocks {r['leaked_blocks']}")
        for key, goal in GOALS.items():
            held = r[key] >= goal
            print(f"  goal {key} >= {goal}: {r[key]:.2f} " + ("met" if held else "MISSED"))
        k, d = r["step_costs"], r["decode_step_s"]
        print(f"  a step costs {k['fixed_s'] * 1e3:.2f} ms fixed + {k['per_seq_s'] * 1e3:.2f} ms per sequence + "
              f"{k['per_token_s'] * 1e3:.3f} ms per prompt token (the fixed part is {k['fixed_share']:.0%} of step time); "
              "decode step ms by batch: " + ", ".join(f"{b}: {s * 1e3:.1f}" for b, s in d.items()
                                                      if b in (1, 2, 4, 8, 16, 32, 64, 128, 256)))


def _without_records(report: dict) -> dict:
    """The report without the runs' per-step records (kept for :func:`step_costs`, too long for JSON)."""
    out = {k: ({kk: vv for kk, vv in v.items() if kk != "records"} if k in ("continuous", "static") else v)
           for k, v in report.items()}
    if "same_memory" in out:
        m = out["same_memory"]
        out["same_memory"] = {**m, "systems": {n: {k: v for k, v in x.items() if k != "records"}
                                               for n, x in m["systems"].items()}}
    return out


def _main_url(args, p) -> int:
    from inferlab.bench.serve_client import run_client

    workload = make_workload(args.num_requests, args.seed, request_rate=args.request_rate)
    model = None if args.model == p.get_default("model") else args.model
    r = run_client(args.url, workload, model)
    if args.json:
        print(json.dumps(_rounded(r)))
    else:
        print(f"{r['requests']} requests to {r['url']} ({r['model']}), rate {args.request_rate}/s, seed {args.seed}")
        print(f"completed {r['completed']}/{r['requests']}, {r['tokens_per_s']:.1f} output tokens/s, "
              f"TTFT p50 {r['ttft_p50_s'] or 0:.3f} s p99 {r['ttft_p99_s'] or 0:.3f} s, "
              f"TPOT p50 {(r['tpot_p50_s'] or 0) * 1e3:.2f} ms")
        if r["first_error"]:
            print(f"first error: {r['first_error']}")
    return 0 if r["completed"] == r["requests"] else 1


def _rounded(v):
    """Floats to 4 decimals for the JSON report; an infinite rate (all at once) as null."""
    if isinstance(v, dict):
        return {str(k): _rounded(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    if isinstance(v, float):
        return round(v, 4) if math.isfinite(v) else None
    return v
