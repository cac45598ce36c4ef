"""The optional step hook: each step's record says what the scheduler ran, and nothing else changes."""
from __future__ import annotations

from inferlab.sampling import SamplingParams

from .conftest import make_engine, run_all


def traced(engine, prompts, max_tokens):
    records = []
    engine.step_hooks.append(lambda eng, rec: records.append(rec))
    for i, (p, n) in enumerate(zip(prompts, max_tokens)):
        engine.add_request(f"q{i}", p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    return records, run_all(engine)


def test_records_account_for_every_token(tiny):
    prompts = [list(range(3, 3 + n)) for n in (5, 40, 9)]
    engine = make_engine(tiny, block_size=4, max_num_seqs=2, enable_chunked_prefill=True, max_num_batched_tokens=16)
    records, finals = traced(engine, prompts, [6, 3, 5])
    assert [r["step"] for r in records] == list(range(engine.counters["num_steps"]))
    computed = {}
    for rec in records:
        assert rec["num_batched_tokens"] == sum(r["num_new_tokens"] for r in rec["scheduled"]) <= 16
        assert len(rec["scheduled"]) <= 2
        for row in rec["scheduled"]:
            assert row["start"] == computed.get(row["request_id"], 0), "chunks follow each other"
            computed[row["request_id"]] = row["start"] + row["num_new_tokens"]
            if row["kind"] == "decode":
                assert row["num_new_tokens"] == 1 and not row["chunk"]
    # every prompt token and every output token but the last went through the model once
    for i, (p, n) in enumerate(zip(prompts, [6, 3, 5])):
        assert computed[f"q{i}"] == len(p) + n - 1
        assert len(finals[f"q{i}"].outputs[0].token_ids) == n
    chunks = [r for rec in records for r in rec["scheduled"] if r["request_id"] == "q1" and r["kind"] == "prefill"]
    assert len(chunks) >= 3 and all(r["chunk"] for r in chunks), "a 40-token prompt under a 16-token budget is chunked"
    finished = [rid for rec in records for rid in rec["finished"]]
    assert sorted(finished) == ["q0", "q1", "q2"]
    assert all(rec["seconds"] >= 0 for rec in records)


def test_records_show_preemptions_and_the_hook_changes_no_token(tiny):
    prompts = [list(range(3, 3 + n)) for n in (6, 7, 5, 8)]
    plain = make_engine(tiny, block_size=4, num_kv_blocks=8, max_num_seqs=4)
    for i, p in enumerate(prompts):
        plain.add_request(f"q{i}", p, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    want = {k: o.outputs[0].token_ids for k, o in run_all(plain).items()}
    engine = make_engine(tiny, block_size=4, num_kv_blocks=8, max_num_seqs=4)
    records, finals = traced(engine, prompts, [10] * 4)
    assert {k: o.outputs[0].token_ids for k, o in finals.items()} == want
    preempted = [rid for rec in records for rid in rec["preempted"]]
    assert preempted and len(preempted) == engine.num_preemptions == plain.num_preemptions
    # a preempted request starts again from position 0 (recompute)
    rid = preempted[0]
    after = next(i for i, rec in enumerate(records) if rid in rec["preempted"])
    again = next(r for rec in records[after + 1:] for r in rec["scheduled"] if r["request_id"] == rid)
    assert again["start"] == 0 and again["kind"] == "prefill"
