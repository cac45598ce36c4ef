"""The offline serving benchmark: a seeded workload, both policies, the same completions."""
from __future__ import annotations

import json

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
    from inferlab.loader import load_checkpoint
    from inferlab.sampling import SamplingParams

    from .conftest import same_greedy

    save_with_tokenizer(tmp_path)
    workload = make_workload(12, seed=0, max_tokens=24, num_system_prompts=0)  # 128-token context
    runs = {p: run_offline(dict(model=str(tmp_path), device="cpu", max_num_seqs=4, scheduler_policy=p), workload,
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
    assert main(["bench", "serve", "--model", "draft", "--num-requests", "6", "--max-num-seqs", "3", "--repeats", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["continuous"]["requests"] == data["static"]["requests"] == 6 and data["continuous_over_static_tokens_per_s"] > 0
