"""``inferlab bench serve``: the workload's shape, the report's fields, and ``--url`` mode."""
from __future__ import annotations

import json
import statistics

import pytest

from inferlab.bench.serve import make_workload, run_offline
from inferlab.cli import main
from inferlab.llm import LLM

FIELDS = {"requests", "completed", "static_tokens_per_s", "continuous_tokens_per_s", "continuous_over_static_tokens_per_s", "ttft_p50_s",
          "ttft_p99_s", "tpot_p50_s", "preemptions", "prefix_hit_rate", "leaked_blocks"}


def test_poisson_arrivals_and_shared_system_prompts():
    w = make_workload(2000, seed=3, request_rate=20.0)
    arrivals = [r["arrival_s"] for r in w]
    gaps = [b - a for a, b in zip([0.0] + arrivals, arrivals)]
    assert arrivals == sorted(arrivals) and min(gaps) >= 0
    assert statistics.fmean(gaps) == pytest.approx(1 / 20, rel=0.1)  # exponential gaps, mean 1/rate
    assert statistics.stdev(gaps) == pytest.approx(1 / 20, rel=0.15)  # and standard deviation 1/rate
    assert all(r["arrival_s"] == 0 for r in make_workload(50, seed=3))  # rate inf: all at once
    shared = sum(r["prompt"].startswith('"""Helpers') for r in w) / len(w)
    assert 0.4 < shared < 0.6
    assert not any(r["prompt"].startswith('"""') for r in make_workload(50, num_system_prompts=0))


def test_run_offline_honours_arrivals_and_reuses_prefixes():
    llm = LLM("draft", device="cpu", max_num_seqs=4, enable_prefix_caching=True)
    w = make_workload(12, seed=0, max_tokens=16, request_rate=40.0, shared_fraction=1.0, num_system_prompts=1)
    r = run_offline({}, w, llm=llm)
    assert r["requests"] == 12 and r["output_tokens"] == sum(x["max_tokens"] for x in w)
    assert r["elapsed_s"] >= w[-1]["arrival_s"]
    assert r["prefix_hit_rate"] > 0.5  # every prompt after the first starts with the same header
    assert r["leaked_blocks"] == 0
    assert 0 < r["ttft_p50_s"] <= r["ttft_p99_s"]


def test_offline_report_has_the_fields(capsys):
    assert main(["bench", "serve", "--model", "draft", "--num-requests", "4", "--max-num-seqs", "2", "--repeats", "1", "--compare", "slots",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert FIELDS <= set(data)
    assert data["requests"] == data["completed"] == 4 and data["leaked_blocks"] == 0
    assert data["continuous_over_static_tokens_per_s"] == pytest.approx(data["continuous_tokens_per_s"] / data["static_tokens_per_s"], rel=1e-3)


def test_url_mode_against_inferlab_serve(server, capsys):
    assert main(["bench", "serve", "--url", server.url, "--num-requests", "8", "--request-rate", "50",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["url"] == server.url and data["model"] == "draft"
    assert data["requests"] == data["completed"] == 8
    want = sum(r["max_tokens"] for r in make_workload(8, request_rate=50.0))
    assert data["output_tokens"] == want
    assert {"ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tokens_per_s"} <= set(data)


def test_url_mode_unreachable_server_fails_cleanly(capsys):
    assert main(["bench", "serve", "--url", "http://127.0.0.1:9", "--num-requests", "2"]) == 2
    err = capsys.readouterr().err
    assert "is an OpenAI-compatible server running there" in err and "Traceback" not in err


def test_a_small_pool_preempts_and_still_completes_without_leaks():
    llm = LLM("draft", device="cpu", max_num_seqs=8, num_kv_blocks=16, enable_prefix_caching=True)
    w = make_workload(16, seed=0, max_tokens=32)
    r = run_offline({}, w, llm=llm)
    assert r["num_preemptions"] > 0
    assert r["requests"] == 16 and r["output_tokens"] == sum(x["max_tokens"] for x in w)
    assert r["leaked_blocks"] == 0
