"""``inferlab bench kv``: waste counted on a replayed workload, checked against its own bounds."""
from __future__ import annotations

import json

import pytest

from inferlab.bench.kv import make_workload, replay, run
from inferlab.cli import main


@pytest.fixture(scope="module")
def small():
    return run(num_requests=40, block_size=16, max_model_len=1024, max_num_seqs=8, seed=1)


def test_paged_waste_is_at_most_one_partial_block_per_sequence(small):
    seq_steps = small["contiguous_reserved_tokens"] // small["max_model_len"]
    slack = small["paged_reserved_tokens"] - small["used_tokens"]
    assert 0 <= slack <= (small["block_size"] - 1) * seq_steps
    assert 0 <= small["paged_waste"] < small["contiguous_waste"] < 1
    assert small["contiguous_waste"] == pytest.approx(1 - small["used_tokens"] / small["contiguous_reserved_tokens"])


def test_shared_system_prompts_are_hit(small):
    assert 0 < small["prefix_hit_rate"] <= 1 and small["shared_blocks"] > 0
    assert 0 < small["prefix_saving"] < 1 and small["prefix_cached_reserved_tokens"] < small["paged_reserved_tokens"]


def test_block_size_one_wastes_nothing_and_random_prompts_share_nothing():
    reqs = make_workload(20, 1024, seed=2, shared_fraction=0.0)
    t = replay(reqs, block_size=1, max_num_seqs=4, max_model_len=1024, enable_prefix_caching=True)
    assert t["paged"] == t["used"] and t["stats"]["prefix_hits"] == 0
    assert t["stats"]["used_blocks"] == 0 and t["stats"]["free_blocks"] == t["stats"]["total_blocks"]


def test_workload_is_seeded_and_fits_the_context():
    a, b = make_workload(30, 1024, seed=3), make_workload(30, 1024, seed=3)
    assert a == b and a != make_workload(30, 1024, seed=4)
    assert all(len(r.prompt) + len(r.output) <= 1024 for r in a)


def test_default_workload_meets_the_paper_claims(capsys):
    assert main(["bench", "kv", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["max_model_len"] >= 1024 and "token-steps" in r["how_counted"]
    assert r["paged_waste"] <= 0.02 and r["contiguous_waste"] >= 0.60


def test_table_output(capsys):
    assert main(["bench", "kv", "--num-requests", "10", "--max-model-len", "1024"]) == 0
    out = capsys.readouterr().out
    assert "contiguous (max length)" in out and "waste" in out and "how counted" in out


def test_bad_block_size_is_one_line(capsys):
    assert main(["bench", "kv", "--block-size", "0"]) == 2
    assert "must be positive" in capsys.readouterr().err


def test_a_small_pool_preempts_and_still_finishes_everything():
    reqs = make_workload(12, 512, seed=5)
    seen = []
    t = replay(reqs, block_size=8, num_blocks=80, max_num_seqs=8, max_model_len=512,
               on_step=lambda step, bm, running: seen.append(bm.num_blocks - bm.num_free_blocks))
    assert t["preemptions"] > 0 and max(seen) <= 80
    assert t["stats"]["free_blocks"] == 80 and t["used"] <= t["paged"]
    assert t["used"] >= sum(len(r.prompt) + len(r.output) for r in reqs)   # every token was held at least once


def test_a_request_larger_than_the_pool_is_a_clear_error():
    with pytest.raises(ValueError, match="does not fit in 4 blocks"):
        replay(make_workload(3, 512, seed=0), block_size=8, num_blocks=4, max_model_len=512)
