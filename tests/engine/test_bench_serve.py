"""The offline serving benchmark: a seeded workload, both policies, the same completions."""
from __future__ import annotations

import json

import pytest

from inferlab.bench.serve import make_workload, run_offline
from inferlab.cli import main


def test_workload_is_seeded_and_long_tailed():
    a, b = make_workload(200, seed=1), make_workload(200, seed=1)
    assert a == b and a != make_workload(200, seed=2)
    lengths = sorted(r["max_tokens"] for r in a)
    assert lengths[0] >= 8 and lengths[-1] <= 128 and lengths[len(lengths) // 2] < lengths[-1] / 3


def test_run_offline_both_policies(tmp_path):
    """Both policies give every request the completion of a solo greedy run of the contiguous path;
    only the schedule differs (continuous needs fewer steps)."""
    from core.checkpoints import save_with_tokenizer

    from inferlab.generate import generate
    from inferlab.model.loader import load_checkpoint
    from inferlab.sampling import SamplingParams

    from .conftest import same_greedy

    save_with_tokenizer(tmp_path)
    workload = make_workload(12, seed=0, max_tokens=24, num_system_prompts=0)  # 128-token context
    runs = {p: run_offline(dict(model=str(tmp_path), device="cpu", max_num_seqs=4, batching_policy=p), workload,
                           keep_outputs=True)
            for p in ("continuous", "static")}
    for r in runs.values():
        assert r["requests"] == 12 and r["output_tokens"] == sum(w["max_tokens"] for w in workload)
        assert r["output_tokens_per_s"] > 0 and r["mean_ttft_s"] > 0
    assert runs["continuous"]["num_steps"] < runs["static"]["num_steps"]  # idle slots refilled
    model, tok = load_checkpoint(tmp_path, device="cpu")
    for w, cont, stat in zip(workload, runs["continuous"]["token_ids"], runs["static"]["token_ids"]):
        ids = tok.encode(w["prompt"])
        solo = generate(model, [ids], [SamplingParams(temperature=0, max_tokens=w["max_tokens"], ignore_eos=True)])
        want = solo[0].output_token_ids
        assert same_greedy(model, ids, cont, want) and same_greedy(model, ids, stat, want)


def test_bench_serve_cli_json(capsys):
    assert main(["bench", "serve", "--model", "draft", "--num-requests", "6", "--max-num-seqs", "3", "--repeats", "1", "--compare", "slots", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["continuous"]["requests"] == data["static"]["requests"] == 6 and data["continuous_over_static_tokens_per_s"] > 0


def _record(kinds: list[str], tokens: int, seconds: float) -> dict:
    return {"scheduled": [{"kind": k} for k in kinds], "num_batched_tokens": tokens, "seconds": seconds}


def test_step_costs_recover_what_a_step_grows_with():
    """Steps timed as 3 ms fixed + 0.5 ms per sequence + 0.02 ms per prompt token: the fit gives
    those three back, and the fixed part's share of the total time."""
    from inferlab.bench.stats import step_costs

    shapes = [(1, 1), (4, 4), (16, 16), (2, 40), (8, 200), (3, 3), (5, 90)]  # (sequences, tokens)
    records = [_record(["decode"] * b, t, 0.003 + 0.0005 * b + 0.00002 * (t - b)) for b, t in shapes]
    fit = step_costs(records)
    assert fit["fixed_s"] == pytest.approx(0.003) and fit["per_seq_s"] == pytest.approx(0.0005)
    assert fit["per_token_s"] == pytest.approx(0.00002, rel=1e-6)
    assert fit["fixed_share"] == pytest.approx(0.003 * len(shapes) / sum(r["seconds"] for r in records))


def test_decode_step_seconds_keeps_decode_only_steps():
    from inferlab.bench.stats import decode_step_seconds

    records = [_record(["decode"], 1, 0.010), _record(["decode"], 1, 0.002), _record(["decode"], 1, 0.003),
               _record(["decode", "decode"], 2, 0.004), _record(["decode", "prefill"], 30, 0.5)]
    assert decode_step_seconds(records) == {1: 0.003, 2: 0.004}  # medians; the step with a prefill is left out


def test_bench_serve_reports_several_models_with_goals_and_step_costs(capsys):
    args = ["bench", "serve", "--model", "draft,target", "--num-requests", "6", "--max-num-seqs", "3", "--repeats", "1", "--compare", "slots"]
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [m["model"] for m in data["models"]] == ["draft", "target"]
    for m in data["models"]:
        assert m["tokens_ratio_over_step_ratio"] == pytest.approx(
            m["continuous_over_static_tokens_per_s"] / m["static_over_continuous_steps"], rel=1e-2)
        assert m["step_costs"]["fixed_s"] is not None and "1" in m["decode_step_s"]
        assert "records" not in m["continuous"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("goal continuous_over_static_tokens_per_s >= 2.0") == 2 and "a step costs" in out
