"""The allocator view draws what the BlockManager holds at each step."""
from __future__ import annotations

import pytest

pytest.importorskip("plotly")
pytest.importorskip("ipywidgets")

from inferlab import viz  # noqa: E402
from inferlab.bench.kv import replay  # noqa: E402
from inferlab.viz import kv_blocks as bp  # noqa: E402


def _truth():
    """The allocator's own answers at every step, asked directly (not through snapshots)."""
    truth = []

    def on_step(step, bm, running):
        holders = {}
        for seq in sorted(running):
            for b in bm.block_table(seq):
                holders.setdefault(b, []).append(seq)
        truth.append({"holders": holders, "cached": {b for b in range(bm.num_blocks) if bm.is_cached(b)},
                      "refs": [bm.ref_count(b) for b in range(bm.num_blocks)],
                      "tokens": {s: bm.num_tokens(s) for s in running}})

    replay(bp.demo_requests(), 4, num_blocks=24, max_num_seqs=6, max_model_len=32,
           enable_prefix_caching=True, on_step=on_step)
    return truth


def test_every_frame_matches_the_allocator():
    trace, truth = viz.record_trace(), _truth()
    assert len(trace) == len(truth)
    saw = {"shared": 0, "cached": 0}
    for step, (snap, want) in enumerate(zip(trace, truth)):
        fig = viz.pool_figure(trace, step)
        colors, texts = fig.data[0].marker.color, fig.data[0].text
        for b in range(24):
            who = want["holders"].get(b)
            expected = bp.seq_color(who[0]) if who else bp.CACHED if b in want["cached"] else bp.FREE
            assert colors[b] == expected, (step, b)
            assert (f"x{want['refs'][b]}" in texts[b]) == (want["refs"][b] > 1)
            saw["shared"] += want["refs"][b] > 1
            saw["cached"] += b in want["cached"]
        seqs = sorted(want["tokens"])
        assert list(fig.data[1].y) == [f"seq {s}" for s in seqs]
        assert list(fig.data[1].x) == [want["tokens"][s] for s in seqs]
        assert [u + e for u, e in zip(fig.data[1].x, fig.data[2].x)] == [32] * len(seqs)
    assert saw["shared"] and saw["cached"]          # the demo shows sharing and cached-but-free blocks


def test_waste_counts_shared_blocks_once():
    trace = viz.record_trace()
    step = next(i for i, s in enumerate(trace) if s["stats"]["shared_blocks"])
    w = bp.waste(trace[step])
    assert w["paged_used"] < w["used"] <= w["contiguous"]
    assert 0 <= w["paged_waste"] < w["contiguous_waste"] < 1


def _sent_figure(live):
    """The figure as the browser receives it: the plotly JSON in the LiveFigure's Output widget."""
    (output,) = live.widget.children[-1].outputs
    return output["data"]["application/vnd.plotly.v1+json"]


def _assert_sent_shows(sent, snap):
    """The sent figure holds ``snap``'s blocks and sequences (not placeholders, nothing undefined)."""
    pts, bars = bp.pool_points(snap), bp._contiguous_bars(snap)
    blocks, used, empty = sent["data"]
    assert blocks["x"] == pts["x"] and blocks["y"] == pts["y"] and blocks["text"] == pts["text"]
    assert blocks["marker"]["color"] == pts["color"]
    assert used["y"] == empty["y"] == bars["y"] and used["x"] == bars["used"] and empty["x"] == bars["empty"]
    assert sent["layout"]["title"]["text"].startswith(f"step {snap['step']}:")


def test_widget_steps_and_shows_a_block_table():
    import plotly.graph_objects as go

    trace = viz.record_trace()
    live = viz.block_pool(trace, step=4)
    bundle = live._repr_mimebundle_()
    assert {"application/vnd.jupyter.widget-view+json", "text/html"} <= set(bundle)
    assert "step 4" in bundle["text/html"]
    assert not any(isinstance(w, go.FigureWidget) for w in live.widget.children)  # no anywidget to time out
    _assert_sent_shows(_sent_figure(live), trace[4])  # the first view, before any control moves
    controls = live.widget.children[0].children
    slider, seq_box = controls[1], controls[2]
    slider.value = 9
    assert "step 9" in live.header.value
    _assert_sent_shows(_sent_figure(live), trace[9])
    assert [v for _, v in seq_box.options] == sorted(trace[9]["tables"])
    seq = seq_box.options[-1][1]
    seq_box.value = seq
    table = live.widget.children[2].value
    for b in trace[9]["tables"][seq]:
        assert f"<b>{b}</b>" in table
    gold = [i for i, c in enumerate(_sent_figure(live)["data"][0]["marker"]["line"]["color"]) if c == bp.SELECTED]
    assert gold == sorted(trace[9]["tables"][seq])
    with pytest.raises(ValueError, match="outside the trace"):
        viz.block_pool(trace, step=len(trace))
