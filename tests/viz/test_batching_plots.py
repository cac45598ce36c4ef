"""Notebook 05's figures hold what the engine's step records say."""
from __future__ import annotations

import pytest

pytest.importorskip("plotly")
pytest.importorskip("ipywidgets")

from inferlab import LLM, viz  # noqa: E402
from inferlab.bench.serve import make_workload  # noqa: E402
from inferlab.viz import batching_plots as bp  # noqa: E402

WORKLOAD = [dict(w, max_tokens=n) for w, n in zip(make_workload(6, seed=3, shared_fraction=0.0), [2, 9, 3, 8, 2, 6])]


@pytest.fixture(scope="module")
def runs():
    out = {}
    for policy in ("static", "continuous"):
        llm = LLM("target", device="cpu", max_num_seqs=3, batching_policy=policy, block_size=8, num_kv_blocks=64,
                  max_model_len=96)
        out[policy] = bp.run_traced(llm, WORKLOAD, snapshots=policy == "continuous")
    return out


def test_run_holds_every_request_and_step(runs):
    for run in runs.values():
        assert len(run["requests"]) == len(WORKLOAD) and run["num_steps"] == len(run["records"])
        for (rid, r), w in zip(run["requests"].items(), WORKLOAD):
            assert r["output_tokens"] == w["max_tokens"] == len(r["token_ids"])
            assert 1 <= r["ttft_steps"] <= r["finish_step"] + 1 <= run["num_steps"]
    s, c = runs["static"], runs["continuous"]
    assert c["num_steps"] < s["num_steps"]
    assert all(s["requests"][k]["token_ids"] == c["requests"][k]["token_ids"] for k in s["requests"])


def test_states_and_segments_follow_the_records(runs):
    for run in runs.values():
        table = bp.states(run)
        scheduled = sum(len(rec["scheduled"]) for rec in run["records"])
        assert sum(st not in (None, "waiting") for row in table.values() for st in row) == scheduled
        segs = bp.segments(run)
        for rid, row in table.items():
            mine = [sg for sg in segs if sg["request_id"] == rid]
            assert sum(sg["length"] for sg in mine) == run["requests"][rid]["finish_step"] + 1
            for sg in mine:
                assert row[sg["start"]:sg["start"] + sg["length"]] == [sg["state"]] * sg["length"]
    # static: a request of the second batch waits until the first batch has drained
    late = bp.states(runs["static"])["r3"]
    assert late[0] == "waiting" and late.index("prefill") > max(runs["static"]["requests"][f"r{i}"]["finish_step"]
                                                               for i in range(3)) - 1


def test_figures_carry_the_data(runs):
    c = runs["continuous"]
    fig = bp.timeline_figure(c)
    decode = next(t for t in fig.data if t.name == "decode")
    want = [sg for sg in bp.segments(c) if sg["state"] == "decode"]
    assert list(decode.base) == [sg["start"] for sg in want] and list(decode.x) == [sg["length"] for sg in want]
    occ = bp.occupancy_figure(runs)
    assert [list(t.y) for t in occ.data] == [bp.batch_sizes(r) for r in runs.values()]
    assert max(max(t.y) for t in occ.data) <= 3
    lat = bp.latency_figure(runs)
    assert sorted(lat.data[0].y) == sorted(r["ttft_steps"] for r in runs["static"]["requests"].values())
    kv = bp.kv_usage_figure(runs)
    assert list(kv.data[-1].y) == [rec["kv_usage"] for rec in c["records"]]
    view = bp.timeline_view(runs, first="static")
    assert "static" in view.header.value and list(view.figure.data[3].x) == [
        sg["length"] for sg in bp.segments(runs["static"]) if sg["state"] == "decode"]
    bundle = view._repr_mimebundle_()
    assert "text/html" in bundle


def test_snapshots_feed_the_pool_view(runs):
    c = runs["continuous"]
    snaps = [rec["snapshot"] for rec in c["records"]]
    assert [s["stats"]["used_blocks"] / s["stats"]["total_blocks"] for s in snaps] == [rec["kv_usage"] for rec in c["records"]]
    pool = viz.block_pool(snaps, step=2)
    assert "step 2" in pool.header.value


def test_best_of_rounds_takes_each_steps_fastest_round(runs):
    import copy

    run = runs["continuous"]
    assert all(rec["wall_s"] >= rec["seconds"] > 0 for rec in run["records"])  # the whole step() call
    slow, fast = copy.deepcopy(run), copy.deepcopy(run)
    for i, (a, b) in enumerate(zip(slow["records"], fast["records"])):  # each round fastest on half the steps
        a["wall_s"], b["wall_s"] = (0.001, 0.005) if i % 2 else (0.005, 0.001)
    best = bp.best_of_rounds([slow, fast])
    assert best["elapsed_s"] == pytest.approx(0.001 * run["num_steps"])
    assert best["tokens_per_s"] == pytest.approx(run["output_tokens"] / (0.001 * run["num_steps"]))
    assert [rec["wall_s"] for rec in best["records"]] == [0.001] * run["num_steps"]
    assert len(best["round_tokens_per_s"]) == 2
    with pytest.raises(ValueError, match="deterministic schedule"):
        bp.best_of_rounds([run, runs["static"]])


def test_throughput_figure_shows_both_ratios(runs):
    best = {name: dict(run, round_tokens_per_s=[run["tokens_per_s"] * 0.9, run["tokens_per_s"]])
            for name, run in runs.items()}
    fig = bp.throughput_figure(best, 1.5, {1: 0.002, 2: 0.0025, 3: 0.003})
    tokens, rounds, ratio, decode = fig.data
    assert list(tokens.x) == ["static", "continuous"] and list(tokens.y) == [runs[k]["tokens_per_s"] for k in tokens.x]
    assert len(rounds.y) == 4
    assert list(ratio.y) == pytest.approx([1.5, runs["continuous"]["tokens_per_s"] / runs["static"]["tokens_per_s"]])
    assert list(decode.x) == [1, 2, 3] and list(decode.y) == pytest.approx([2.0, 2.5, 3.0])
