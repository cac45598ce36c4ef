"""The benchmark client against ``inferlab serve``: every request completes, counts add up."""
from __future__ import annotations

import pytest

from inferlab.bench.stats import percentile
from inferlab.bench.serve_client import run_client


def test_percentile_matches_numpy():
    np = pytest.importorskip("numpy")
    xs = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4]
    for q in (0, 50, 90, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([], 50) is None


def test_client_measures_a_small_workload(server):
    from serve.conftest import wait_idle

    workload = [{"prompt": f"def f{i}(x):", "max_tokens": 4 + 3 * i, "arrival_s": 0.02 * i} for i in range(8)]
    r = run_client(server.url, workload)
    assert r["model"] == "draft" and r["requests"] == r["completed"] == 8 and r["first_error"] is None
    assert r["output_tokens"] == sum(w["max_tokens"] for w in workload)  # ignore_eos: exact lengths
    assert 0 < r["ttft_p50_s"] <= r["ttft_p99_s"] < r["duration_s"]
    assert r["tpot_p50_s"] > 0 and r["tokens_per_s"] == pytest.approx(r["output_tokens"] / r["duration_s"])
    assert wait_idle(server)["used_blocks"] == 0


def test_client_reports_refused_requests(server):
    r = run_client(server.url, [{"prompt": "x", "max_tokens": 4}, {"prompt": "x", "max_tokens": 9999}])
    assert r["requests"] == 2 and r["completed"] == 1
    assert r["first_error"].startswith("HTTP 400")
