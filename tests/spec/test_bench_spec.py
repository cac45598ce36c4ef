"""``inferlab bench spec`` reports every field of its table, with outputs identical to plain decoding."""
from __future__ import annotations

import pytest

from inferlab.bench import spec


@pytest.mark.slow
def test_bench_spec_small_run():
    res = spec.run(ks=(2,), num_prompts=1, prompt_tokens=32, new_tokens=8, repeats=1)
    assert res["baseline_tokens_per_s"] > 0
    assert [(r["method"], r["num_speculative_tokens"]) for r in res["methods"]] == [("ngram", 2), ("draft", 2)]
    for r in res["methods"]:
        assert r["outputs_identical"] is True
        assert 0 <= r["acceptance_rate"] <= 1 and 1 <= r["mean_acceptance_length"] <= 3
        assert r["verify_cost_ratio"] > 0 and r["predicted_speedup"] > 0
    assert res["methods"][1]["draft_cost_ratio"] > 0


def test_engine_table_small_run():
    """The engine's batch table: every row's outputs equal the engine without speculation, the
    counters give an acceptance rate in [0, 1], and accepted guesses save verify steps."""
    from inferlab.loader import load_checkpoint

    model, tok = load_checkpoint("target", device="cpu")
    rows = spec.engine_table(model, tok, ks=(2,), batch_sizes=(1, 2), prompt_tokens=32, new_tokens=8, repeats=1)
    assert [(r["batch_size"], r["method"]) for r in rows] == [(1, "ngram"), (1, "draft"), (2, "ngram"), (2, "draft")]
    for r in rows:
        assert r["outputs_identical"] is True
        assert 0 <= r["acceptance_rate"] <= 1 and 1 <= r["mean_acceptance_length"] <= 3
        assert r["tokens_per_s"] > 0 and r["baseline_tokens_per_s"] > 0
    assert rows[0]["steps"] < rows[0]["baseline_steps"] == 8
