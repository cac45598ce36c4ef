"""The decode benchmark runs both engines on one checkpoint and reports their ratio (not timed)."""
from __future__ import annotations

import json

from inferlab.bench.decode import run
from inferlab.cli import main

from .checkpoints import save_with_tokenizer


def test_bench_decode_json(tmp_path, capsys):
    save_with_tokenizer(tmp_path)
    assert main(["bench", "decode", "--model", str(tmp_path), "--new-tokens", "8", "--repeats", "1", "--json",
                 "--eager-only"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"inferlab_tokens_per_s", "hf_tokens_per_s", "inferlab_over_hf_tokens_per_s"} <= set(data)
    assert data["new_tokens"] == 8 and data["inferlab_tokens_per_s"] > 0 and data["hf_tokens_per_s"] > 0
    r = data["inferlab_over_hf_tokens_per_s"]
    assert abs(r - data["inferlab_tokens_per_s"] / data["hf_tokens_per_s"]) < 0.01 * r + 1e-3


def test_bench_unknown_name_exits_2(capsys):
    assert main(["bench", "nope"]) == 2
    assert "decode" in capsys.readouterr().err


def test_bench_decode_sampler_reports_each_setting_against_greedy(capsys):
    assert main(["bench", "decode", "--sampler", "--new-tokens", "2", "--repeats", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["cost_vs_greedy"]) == {"temperature", "top_p", "top_k_top_p"}
    rates = data["tokens_per_s"]
    for k, v in data["cost_vs_greedy"].items():
        assert abs(v - rates["greedy"] / rates[k]) < 0.01 * v + 0.01
    assert data["met"] == (max(data["cost_vs_greedy"].values()) <= 1.3)


def test_a_missed_speedup_over_fp32_says_what_the_bytes_allow():
    """The int4 >= 3x fp32 goal, missed, names the bound the bytes set (fp32's MB over int4's), each
    format's share of the bandwidth, and the speed-up with the head quantized too where measured."""
    from inferlab.bench.decode import why_missed

    rows = [{"model": "m", "precision": "fp32", "weight_mb": 513.1, "engine_tokens_per_s": 68.4, "bandwidth_fraction": 0.47},
            {"model": "m", "precision": "int4", "weight_mb": 162.9, "engine_tokens_per_s": 178.0, "bandwidth_fraction": 0.39},
            {"model": "m", "precision": "int4+head", "weight_mb": 82.0, "engine_tokens_per_s": 300.5, "bandwidth_fraction": 0.33}]
    text = why_missed(rows, "m", "int4", "engine", "fp32", "engine", 3.0)
    assert "allow 3.15x" in text and "513.1 MB" in text and "int4 reads at 39%" in text and "fp32 at 47%" in text
    assert "with the head quantized too (int4+head, 82.0 MB): 4.39x" in text
    assert "below the goal" not in text
    assert "below the goal even at equal bandwidth" in why_missed(rows, "m", "int4", "engine", "fp32", "engine", 3.5)
    assert "head quantized" not in why_missed(rows[:2], "m", "int4", "engine", "fp32", "engine", 3.0)
    assert why_missed(rows, "m", "int4", "engine", "fp32", "llama.cpp", 3.0) is None


def test_best_times_takes_its_functions_in_turn_and_keeps_each_ones_best(monkeypatch):
    """Costs compared as ratios are timed one call of each a round (a burst of other work then lands on
    both sides of a ratio), after one warm-up call each, and each keeps its shortest call."""
    from inferlab.bench import stats

    now, calls = [0.0], []
    durations = {"a": iter([9, 5, 3, 4]), "b": iter([9, 2, 6, 1])}  # the warm-up call, then 3 rounds

    def fn(name):
        def call():
            calls.append(name)
            now[0] += next(durations[name])
        return call

    monkeypatch.setattr(stats.time, "perf_counter", lambda: now[0])
    best = stats.best_times({"a": fn("a"), "b": fn("b")}, repeats=3)
    assert calls == ["a", "b"] + ["a", "b"] * 3
    assert best == {"a": 3, "b": 1}
