"""The capstone: serve one customer-service workload with a *deployment* and measure it.

A deployment is a dict of switches, the engine's knobs plus the strategies of notebook 07:

    quantization             None (fp32 on CPU, fp16 on a GPU), "int8", "awq", ... (inferlab.quant)
    enable_prefix_caching    share the system prompt's KV blocks between requests
    batching_policy         "static" or "continuous"
    max_num_seqs             sequences per step
    semantic_cache_threshold None, or serve FAQ answers at this cosine similarity (wordllama, scoped by topic)
    router_threshold         None, or send requests whose small-model prompt NLL is <= this to the draft
    speculative              None, or n-gram speculative decoding as vLLM's speculative_config:
                             {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}

``serve`` drives the engine(s) one tick at a time (arrivals at their tick, then one step of each
engine) and reports, per request, TTFT and TPOT in steps and in measured seconds; KV memory at
its peak; the work done; and quality: agreement with a reference run's tokens and the wrong answers
the cache served. ``cost`` prices the work as a memory-bound GPU would: every step of a model
reads all its weights once, so a step costs its weight bytes (counted in fp16 steps of the large model).
A speculative step verifies every guess in that one read, so it costs what any step costs; the
n-gram proposer reads no weights (a draft model would, which is why it is not offered here).
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from inferlab.engine import EngineConfig, LLMEngine
from inferlab.engine.policy import check_name as check_batching_policy
from inferlab.sampling import SamplingParams
from inferlab.strategy.router import route

DEFAULT = {"quantization": None, "enable_prefix_caching": False, "batching_policy": "static", "max_num_seqs": 8,
           "semantic_cache_threshold": None, "router_threshold": None, "speculative": None}
BITS = {None: 16, "int8": 8, "q8_0": 8.5, "awq": 4.25, "gptq": 4.25, "int4": 4.25, "nf4": 4.25, "q4_0": 4.5,
        "q4_1": 5.0, "q4_k": 4.5}
BLOCK_SIZE, MAX_MODEL_LEN = 16, 256


def check(deployment: dict) -> dict:
    """The deployment with defaults filled in; a one-line ValueError for anything the runner cannot do."""
    if not isinstance(deployment, dict):
        raise ValueError(f"a deployment is a dict of switches, got {type(deployment).__name__}")
    unknown = set(deployment) - set(DEFAULT)
    if unknown:
        raise ValueError(f"unknown switch(es) {sorted(unknown)}: a deployment may set {sorted(DEFAULT)}")
    d = {**DEFAULT, **deployment}
    if d["quantization"] not in BITS:
        raise ValueError(f"quantization {d['quantization']!r} is not one of {[k for k in BITS if k]} (or None)")
    check_batching_policy(d["batching_policy"])
    if not isinstance(d["max_num_seqs"], int) or not 1 <= d["max_num_seqs"] <= 64:
        raise ValueError(f"max_num_seqs must be an integer in 1..64, got {d['max_num_seqs']!r}")
    if d["speculative"] is not None:
        from inferlab.spec.config import SpeculativeConfig

        spec = SpeculativeConfig.from_dict(d["speculative"])  # its own one-line errors
        if spec.method != "ngram":
            raise ValueError("the capstone prices n-gram speculation only (a draft model's bytes are not counted): "
                             "use {'method': 'ngram', 'num_speculative_tokens': 3}")
    for key in ("semantic_cache_threshold", "router_threshold"):
        if d[key] is not None and not isinstance(d[key], (int, float)):
            raise ValueError(f"{key} is a number or None, got {d[key]!r}")
    return d


class Models:
    """Each (model, quantization) variant loaded and quantized once, reused by every run.
    ``calibration``: (samples, tokens each) for the calibrated methods (AWQ, GPTQ)."""

    def __init__(self, device: str | None = None, calibration: tuple[int, int] = (8, 256)):
        self.device, self.calibration, self._models = device, calibration, {}

    def get(self, name: str, quantization: str | None):
        key = (name, quantization)
        if key not in self._models:
            from inferlab.model.loader import load_checkpoint

            model, tok = load_checkpoint(name, device=self.device)
            if quantization is not None:
                from inferlab.quant import quantize_model

                n, length = self.calibration
                quantize_model(model, quantization, tokenizer=tok, n_samples=n, seq_len=length, progress=False)
            self._models[key] = (model, tok)
        return self._models[key]


@torch.inference_mode()
def prompt_nll(model, ids: list[int]) -> float:
    """The router's signal: a model's mean NLL on the prompt (one prefill)."""
    x = torch.tensor([ids], device=model.device)
    logits = model(x)[0, :-1].float()
    return float(torch.nn.functional.cross_entropy(logits, x[0, 1:]))


@dataclasses.dataclass
class _Req:
    rid: str
    arrival: int
    where: str                      # "cache", "small" or "large"
    first: int | None = None
    finish: int | None = None
    tokens: list = dataclasses.field(default_factory=list)
    right: bool | None = None       # cache hits: was the answer the right one


def serve(deployment: dict, workload: list[dict], models: Models, embedder=None, reference: dict | None = None) -> dict:
    """Run ``workload`` (``inferlab.strategy.workload``) under ``deployment``; see the module docstring.
    ``reference``: {request id: token ids} of a reference run, for the agreement score."""
    d = check(deployment)
    large, tok = models.get("target", d["quantization"])
    knobs = dict(block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN, max_num_seqs=d["max_num_seqs"],
                 enable_prefix_caching=d["enable_prefix_caching"], batching_policy=d["batching_policy"],
                 speculative_config=d["speculative"])
    engines = {"large": LLMEngine(large, tok, EngineConfig(**knobs))}
    small = None
    if d["router_threshold"] is not None:
        small, _ = models.get("draft", d["quantization"])
        engines["small"] = LLMEngine(small, tok, EngineConfig(**knobs))
    cache = None
    if d["semantic_cache_threshold"] is not None:
        from inferlab.strategy.semantic_cache import SemanticCache
        from inferlab.strategy.workload import faq

        if embedder is None:
            from inferlab.strategy.embed import WordLlamaEmbedder
            embedder = WordLlamaEmbedder()
        cache = SemanticCache(embedder, threshold=float(d["semantic_cache_threshold"]), capacity=256)
        for s in faq():
            cache.insert(s["question"], s["intent"], scope=s["topic"])
    by_tick: dict[int, list] = {}
    for i, w in enumerate(workload):
        by_tick.setdefault(w["tick"], []).append((f"r{i}", w))
    reqs: dict[str, _Req] = {}
    tick_s, steps, peak_blocks = [], dict.fromkeys(engines, 0), dict.fromkeys(engines, 0)
    last = max(by_tick)
    tick = 0
    while tick <= last or any(e.has_unfinished_requests() for e in engines.values()):
        spent = 0.0
        for rid, w in by_tick.get(tick, ()):
            t0 = time.perf_counter()
            if cache is not None:
                hit = cache.lookup(w["question"], scope=w["topic"])
                if hit is not None:
                    reqs[rid] = _Req(rid, tick, "cache", tick, tick, right=hit.answer == w["intent"])
                    spent += time.perf_counter() - t0
                    continue
            ids = tok.encode(w["prompt"])
            where = "large" if small is None else route(prompt_nll(small, ids), d["router_threshold"])
            engines[where].add_request(rid, ids, SamplingParams(temperature=0, max_tokens=w["max_tokens"], ignore_eos=True))
            reqs[rid] = _Req(rid, tick, where)
            spent += time.perf_counter() - t0
        for name, e in engines.items():
            if not e.has_unfinished_requests():
                continue
            t0 = time.perf_counter()
            outs = e.step()
            spent += time.perf_counter() - t0
            steps[name] += 1
            peak_blocks[name] = max(peak_blocks[name], e.block_manager.stats()["used_blocks"])
            for o in outs:
                r = reqs[o.request_id]
                if r.first is None and o.outputs[0].token_ids:
                    r.first = tick
                if o.finished:
                    r.finish, r.tokens = tick, list(o.outputs[0].token_ids)
        tick_s.append(spent)
        tick += 1
    return _report(d, workload, reqs, tick_s, steps, peak_blocks, engines, models, reference)


def _q(values, q):
    return float(np.quantile(np.asarray(values, dtype=float), q, method="inverted_cdf")) if len(values) else 0.0


def _acceptance(engines) -> float | None:
    """Share of speculative guesses the verifier kept (None: no speculation)."""
    guessed = sum(e.counters["spec_decode_num_draft_tokens"] for e in engines.values())
    kept = sum(e.counters["spec_decode_num_accepted_tokens"] for e in engines.values())
    return kept / guessed if guessed else None


def _report(d, workload, reqs, tick_s, steps, peak_blocks, engines, models, reference) -> dict:
    cum = np.concatenate([[0.0], np.cumsum(tick_s)])
    ttft_steps, ttft_s, tpot_steps, tpot_s = [], [], [], []
    for r in reqs.values():
        ttft_steps.append(0 if r.where == "cache" else r.first - r.arrival + 1)
        ttft_s.append(0.0 if r.where == "cache" else cum[r.first + 1] - cum[r.arrival])
        if r.where != "cache" and len(r.tokens) > 1:
            tpot_steps.append((r.finish - r.first) / (len(r.tokens) - 1))
            tpot_s.append((cum[r.finish + 1] - cum[r.first + 1]) / (len(r.tokens) - 1))
    generated = sum(len(r.tokens) for r in reqs.values())
    seconds = float(cum[-1])
    kv_bytes = {n: e.kv_cache.nbytes // e.config.num_kv_blocks for n, e in engines.items()}  # per block
    large = models.get("target", d["quantization"])[0]
    weights = {n: e.model.num_parameters() * BITS[d["quantization"]] / 8 for n, e in engines.items()}
    fp16_large = large.num_parameters() * 2
    served = [r for r in reqs.values() if r.where == "cache"]
    report = {
        "requests": len(reqs), "by": {w: sum(r.where == w for r in reqs.values()) for w in ("cache", "small", "large")},
        "ticks": len(tick_s), "engine_steps": sum(steps.values()), "steps": dict(steps),
        "generated_tokens": generated, "seconds": seconds, "tokens_per_s": generated / max(seconds, 1e-9),
        "tokens_per_step": generated / max(steps["large"] + steps.get("small", 0), 1),
        "kv_peak_blocks": sum(peak_blocks.values()),
        "kv_peak_bytes": sum(peak_blocks[n] * kv_bytes[n] for n in engines),
        "kv_contiguous_bytes": sum(d["max_num_seqs"] * MAX_MODEL_LEN * kv_bytes[n] // BLOCK_SIZE for n in engines),
        "ttft_steps_p50": _q(ttft_steps, 0.5), "ttft_steps_p99": _q(ttft_steps, 0.99),
        "ttft_s_p50": _q(ttft_s, 0.5), "ttft_s_p99": _q(ttft_s, 0.99),
        "tpot_steps_p50": _q(tpot_steps, 0.5), "tpot_steps_p99": _q(tpot_steps, 0.99),
        "tpot_s_p50": _q(tpot_s, 0.5), "tpot_s_p99": _q(tpot_s, 0.99),
        "cost": sum(steps[n] * weights[n] for n in engines) / fp16_large,
        "cache_hits": len(served), "wrong_answers": sum(not r.right for r in served),
        "spec_acceptance": _acceptance(engines),
        "tokens": {r.rid: r.tokens for r in reqs.values() if r.where != "cache"},
    }
    if reference is not None:
        match = total = 0
        for rid, toks in report["tokens"].items():
            ref = reference.get(rid, [])
            match += sum(a == b for a, b in zip(toks, ref))
            total += len(ref)
        report["agreement"] = match / max(total, 1)
    return report


# ---------------------------------------------------------------- lab 08: a deployment for a target

LAB_WORKLOAD = dict(n_requests=40, ticks=160, seed=8)
LAB_TARGET = {"ttft_steps_p99": 8, "kv_peak_blocks": 64, "cost": 110, "agreement": 0.85, "wrong_answers": 2}


def reference_deployment() -> dict:
    """One deployment that meets ``LAB_TARGET`` (there are others): continuous batching with room
    for the peak, prefix caching for the shared system prompt, INT8 weights to halve the bytes per
    step, and the FAQ cache scoped by topic at a threshold that serves few wrong answers."""
    return {"batching_policy": "continuous", "max_num_seqs": 12, "enable_prefix_caching": True,
            "quantization": "int8", "semantic_cache_threshold": 0.65}
