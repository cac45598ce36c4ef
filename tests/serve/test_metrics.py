"""/metrics: Prometheus text format (parsed by prometheus_client's own parser), vLLM's names."""
from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape(server) -> dict:
    """name -> {sample name + sorted labels: value}."""
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            extra = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name",)))
            assert s.labels.get("model_name") == "draft"
            out.setdefault(fam.name, {})[(s.name, extra)] = s.value
    return out


def value(m, family, sample=None, **labels):
    return m[family][(sample or family, tuple(sorted(labels.items())))]


def test_metrics_count_what_the_requests_did(server, client):
    from serve.conftest import wait_idle

    wait_idle(server)
    before = scrape(server)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds",
                 "vllm:e2e_request_latency_seconds", "vllm:num_preemptions", "vllm:generation_tokens"):
        assert name in before, name
    ttft0 = value(before, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count")
    gen0 = value(before, "vllm:generation_tokens", "vllm:generation_tokens_total")
    tpot0 = value(before, "vllm:time_per_output_token_seconds", "vllm:time_per_output_token_seconds_count")
    success0 = {r: value(before, "vllm:request_success", "vllm:request_success_total", finished_reason=r)
                for r in ("stop", "length")}

    # streamed and final-only requests, ending at a stop string and at max_tokens
    runs = [(p, s, stop) for p, s, stop in (("import os", False, None), ("def f(x):", True, None),
                                            ("class B:", False, None), ("def f(x):", False, "\n"),
                                            ("def f(x):", True, "\n"))]
    answers = [client.completions.create(model="draft", prompt=p, max_tokens=12, temperature=0, stream=s, stop=stop,
                                         **({"stream_options": {"include_usage": True}} if s else {}))
               for p, s, stop in runs]
    usage, reasons = [], []
    for a in answers:
        if hasattr(a, "usage"):
            usage.append(a.usage)
            reasons.append(a.choices[0].finish_reason)
        else:
            chunks = list(a)
            usage.append(chunks[-1].usage)
            reasons.append([c.choices[0].finish_reason for c in chunks if c.choices][-1])
    assert set(reasons) == {"stop", "length"}
    tokens = sum(u.completion_tokens for u in usage)
    assert all(u.completion_tokens >= 1 for u in usage)
    wait_idle(server)
    after = scrape(server)

    n = len(runs)
    assert value(after, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count") == ttft0 + n
    assert value(after, "vllm:generation_tokens", "vllm:generation_tokens_total") == gen0 + tokens
    # one inter-token gap per token after the first of each request
    assert value(after, "vllm:time_per_output_token_seconds", "vllm:time_per_output_token_seconds_count") \
        == tpot0 + tokens - n
    buckets = [v for (name, labels), v in after["vllm:time_to_first_token_seconds"].items() if name.endswith("_bucket")]
    assert buckets == sorted(buckets)  # cumulative
    assert value(after, "vllm:num_requests_running") == 0
    assert value(after, "vllm:num_requests_waiting") == 0
    assert value(after, "vllm:kv_cache_usage_perc") == 0.0
    # each finished request counted once, under the reason it finished for (not merely present at 0)
    for r in ("stop", "length"):
        assert value(after, "vllm:request_success", "vllm:request_success_total", finished_reason=r) \
            == success0[r] + reasons.count(r)
