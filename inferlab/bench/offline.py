"""One seeded workload through an engine, offline: each request added when its arrival time comes,
the engine stepped until all finish; throughput, latency and the engine's per-step records.
``bench serve`` (continuous vs static at the same slots) and ``bench.kv_budget`` (the same KV
memory) both time their systems through it."""
from __future__ import annotations

import statistics
import time
from collections import deque

from inferlab.bench.stats import percentile
from inferlab.llm import LLM
from inferlab.sampling import SamplingParams


def run_offline(llm_kwargs: dict, workload: list[dict], llm: LLM | None = None, keep_outputs: bool = False) -> dict:
    """Run ``workload`` through ``LLM(**llm_kwargs)``'s engine (or ``llm``'s), each request added
    when its ``arrival_s`` comes; return throughput, latency, scheduler and KV-pool counters, each
    step's record (``LLMEngine.step_record`` with its ``seconds``: what :func:`step_costs` reads)
    and, with ``keep_outputs``, ``"token_ids"``: each request's completion, in workload order."""
    llm = llm or LLM(**llm_kwargs)
    engine = llm.llm_engine
    before = dict(engine.kv_cache_stats(), num_steps=engine.counters["num_steps"])
    pending = deque(sorted(enumerate(workload), key=lambda x: x[1].get("arrival_s", 0.0)))
    finals, records = [], []

    def keep(_engine, record):
        records.append(record)

    engine.step_hooks.append(keep)
    t0 = time.monotonic()
    try:
        while pending or engine.has_unfinished_requests():
            now = time.monotonic()
            while pending and t0 + pending[0][1].get("arrival_s", 0.0) <= now:
                i, req = pending.popleft()
                params = SamplingParams(temperature=0, max_tokens=req["max_tokens"], ignore_eos=True)
                engine.add_request(f"offline-{i}", req["prompt"], params, arrival_time=t0 + req.get("arrival_s", 0.0),
                                   stream=False)
            if engine.has_unfinished_requests():
                finals += [o for o in engine.step() if o.finished]
            elif pending:  # idle until the next arrival
                time.sleep(max(0.0, t0 + pending[0][1]["arrival_s"] - time.monotonic()))
        elapsed = time.monotonic() - t0
    finally:
        engine.step_hooks.remove(keep)
    after = engine.kv_cache_stats()
    out_tokens = sum(len(o.outputs[0].token_ids) for o in finals)
    ttft = [o.metrics.first_token_time - o.metrics.arrival_time for o in finals]
    tpot = [(o.metrics.finished_time - o.metrics.first_token_time) / (len(o.outputs[0].token_ids) - 1)
            for o in finals if len(o.outputs[0].token_ids) > 1]
    latency = [o.metrics.finished_time - o.metrics.arrival_time for o in finals]
    queries = after["prefix_queries"] - before["prefix_queries"]
    by_id = {o.request_id: o.outputs[0].token_ids for o in finals}
    extra = {"token_ids": [by_id.get(f"offline-{i}") for i in range(len(workload))]} if keep_outputs else {}
    return {**extra, "policy": engine.config.batching_policy, "requests": len(finals),
            "prompt_tokens": sum(len(o.prompt_token_ids) for o in finals), "output_tokens": out_tokens,
            "elapsed_s": elapsed, "output_tokens_per_s": out_tokens / elapsed, "requests_per_s": len(finals) / elapsed,
            "mean_ttft_s": statistics.fmean(ttft), "mean_tpot_s": statistics.fmean(tpot) if tpot else 0.0,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99), "tpot_p50_s": percentile(tpot, 50),
            "mean_latency_s": statistics.fmean(latency), "num_steps": engine.counters["num_steps"] - before["num_steps"],
            "num_preemptions": after["num_preemptions"] - before["num_preemptions"],
            "prefix_hit_rate": (after["prefix_hits"] - before["prefix_hits"]) / queries if queries else 0.0,
            "leaked_blocks": after["used_blocks"],  # blocks still referenced with no request left
            "records": records}
