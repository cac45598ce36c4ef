"""``/metrics`` in Prometheus text format, under vLLM's metric names exactly (``vllm:...``), so the
dashboards and alerts written for a vLLM deployment read an inferlab server unchanged.

Gauges and counters the engine keeps (running/waiting requests, KV usage, preemptions, prefix
cache) are read from the engine at scrape time; latency histograms are observed in the engine
thread after every step, from the per-request times the engine records (``RequestMetrics``):

    time_to_first_token   first_token_time - arrival_time        (TTFT: queueing + prefill)
    time_per_output_token gap between a request's consecutive tokens (TPOT, inter-token latency)
    e2e_request_latency   finished_time - arrival_time
    request_queue_time    first_scheduled_time - arrival_time

With ``--speculative-config`` the spec-decode counters tell how well the guesses pay:
``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens`` and ``..._num_accepted_tokens``.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from inferlab.engine.llm_engine import LLMEngine
from inferlab.outputs import RequestOutput

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# vLLM's buckets
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0]
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]

# speculative decoding (vLLM's spec-decode counters): acceptance rate = accepted / draft tokens,
# mean acceptance length = 1 + accepted / drafts
SPEC_COUNTERS = {
    "spec_decode_num_drafts": "Verify steps of a sequence that had speculative guesses.",
    "spec_decode_num_draft_tokens": "Speculative guesses verified.",
    "spec_decode_num_accepted_tokens": "Speculative guesses accepted.",
}


def engine_stats(engine: LLMEngine) -> dict:
    """What a scrape reports about the engine now; run it in the engine thread."""
    s = engine.kv_cache_stats()
    sched = engine.scheduler
    s["num_requests_running"] = len({seq.request_id for seq in sched.running})
    s["num_requests_waiting"] = len({seq.request_id for seq in sched.waiting})
    for name in SPEC_COUNTERS:
        s[name] = engine.counters[name]
    return s


class _EngineCollector:
    """Gauges and counters from the last ``engine_stats`` read (set just before each scrape)."""

    def __init__(self, model_name: str):
        self.model_name, self.stats = model_name, None

    def collect(self):
        s = self.stats
        if s is None:
            return
        def gauge(name, doc, value):
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric([self.model_name], value)
            return g

        def counter(name, doc, value):
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric([self.model_name], value)
            return c

        yield gauge("vllm:num_requests_running", "Requests in the running batch.", s["num_requests_running"])
        yield gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", s["num_requests_waiting"])
        yield gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).", s["usage"])
        yield counter("vllm:num_preemptions", "Sequences preempted (blocks freed, recomputed later).",
                      s["num_preemptions"])
        yield counter("vllm:prefix_cache_queries", "Prompt blocks looked up in the prefix cache.",
                      s["prefix_queries"])
        yield counter("vllm:prefix_cache_hits", "Prompt blocks found in the prefix cache.", s["prefix_hits"])
        for name, doc in SPEC_COUNTERS.items():  # zero without speculation, as in vLLM
            yield counter("vllm:" + name, doc, s[name])


class ServerMetrics:
    def __init__(self, model_name: str):
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.engine_collector = _EngineCollector(model_name)
        self.registry.register(self.engine_collector)
        label = ["model_name"]
        r = self.registry
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", label,
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Time between two output tokens.",
                              label, buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Arrival to last token.", label,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("vllm:request_queue_time_seconds", "Arrival to first scheduled step.",
                               label, buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of finished requests.", label,
                                     registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", label, registry=r)
        self.success = Counter("vllm:request_success", "Finished requests, by finish reason.",
                               ["model_name", "finished_reason"], registry=r)
        for metric in (self.ttft, self.tpot, self.e2e, self.queue, self.prompt_tokens, self.generation_tokens):
            metric.labels(model_name)  # present (at zero) from the first scrape on
        for reason in ("stop", "length"):
            self.success.labels(model_name, reason)
        self._last_token: dict[str, tuple[float, int]] = {}  # request -> (last token time, tokens seen)

    def observe(self, engine: LLMEngine, outputs: list[RequestOutput]) -> None:
        """After a step, in the engine thread: TTFT, inter-token gaps, finished requests.

        Read from the engine's request table, not only from ``outputs``: a final-only request
        (a non-streaming one) has no output until it finishes, yet each of its tokens counts."""
        name = self.model_name
        finished = {out.request_id: out for out in outputs if out.finished}
        live = [(rid, req.metrics, sum(len(seq.output_token_ids) for seq in req.seqs))
                for rid, req in engine.requests.items() if rid not in finished]
        done = [(rid, out.metrics, sum(len(c.token_ids) for c in out.outputs)) for rid, out in finished.items()]
        for rid, m, num_tokens in live + done:
            prev_time, prev_tokens = self._last_token.get(rid, (None, 0))
            new = num_tokens - prev_tokens
            if m is not None and new > 0 and m.last_token_time is not None:
                if prev_time is None:
                    self.ttft.labels(name).observe(m.first_token_time - m.arrival_time)
                    self.queue.labels(name).observe(m.first_scheduled_time - m.arrival_time)
                elif m.last_token_time > prev_time:
                    self.tpot.labels(name).observe(m.last_token_time - prev_time)
                self._last_token[rid] = (m.last_token_time, num_tokens)
                self.generation_tokens.labels(name).inc(new)
        for rid, out in finished.items():
            m = out.metrics
            self._last_token.pop(rid, None)
            self.prompt_tokens.labels(name).inc(len(out.prompt_token_ids))
            for c in out.outputs:
                self.success.labels(name, c.finish_reason).inc()
            if m is not None and m.finished_time is not None:
                self.e2e.labels(name).observe(m.finished_time - m.arrival_time)
        if len(self._last_token) > len(engine.requests):  # aborted requests leave no final output
            for rid in [r for r in self._last_token if r not in engine.requests]:
                del self._last_token[rid]

    def render(self, stats: dict) -> bytes:
        self.engine_collector.stats = stats
        return generate_latest(self.registry)
