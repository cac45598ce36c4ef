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
