"""The allocator view of notebook 02: a paged block pool beside a contiguous cache, step by step.

A small scripted workload is replayed through the :class:`~inferlab.engine.BlockManager` (the same
replay ``inferlab bench kv`` uses) and a snapshot of the pool is recorded after every engine step.
The widget plays the trace back: each physical block is coloured by the sequence that owns it,
blocks held by several sequences (a shared prefix) get a thick outline and ``xN``, free blocks are
grey and cached-but-free ones (findable by a later prefix hit) are shaded. On the right, the same
running sequences in a contiguous cache: one row of ``max_model_len`` slots each, mostly empty.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from inferlab.bench.kv import Request, replay
from inferlab.viz.figures import Live, LiveFigure, escape, style

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#bcbd22", "#7f7f7f"]
FREE, CACHED, EMPTY, SELECTED = "#e6e6e6", "#b8c7dd", "#f4f4f4", "#ffbf00"
LEGEND = "n/{bs}: slots filled | thick outline: shared (xN) | c: cached, free | grey: free | gold: selected"


def seq_color(seq: int) -> str:
    return PALETTE[seq % len(PALETTE)]


def demo_requests() -> list[Request]:
    """Six requests; four open with the same 8-token system prompt (two blocks of 4)."""
    system = [101, 102, 103, 104, 105, 106, 107, 108]
    spec = [(0, system + [1, 2, 3], 7), (1, [21, 22, 23, 24, 25], 9), (2, system + [4, 5], 6),
            (4, [31, 32, 33], 12), (4, system + [6, 7, 8, 9, 10, 11], 3), (14, system + [12], 4)]
    return [Request(t, prompt, [200 + 10 * i + j for j in range(n)]) for i, (t, prompt, n) in enumerate(spec)]


def record_trace(requests: list[Request] | None = None, num_blocks: int = 24, block_size: int = 4,
                 max_model_len: int = 32, max_num_seqs: int = 6, enable_prefix_caching: bool = True) -> list[dict]:
    """Replay ``requests`` (default :func:`demo_requests`) and return one snapshot per engine step."""
    trace = []

    def on_step(step, bm, running):
        snap = bm.snapshot()
        snap.update(step=step, running=sorted(running), max_model_len=max_model_len, stats=bm.stats())
        trace.append(snap)

    replay(requests or demo_requests(), block_size, num_blocks=num_blocks, max_num_seqs=max_num_seqs,
           max_model_len=max_model_len, enable_prefix_caching=enable_prefix_caching, on_step=on_step)
    return trace


def owners(snap: dict) -> dict[int, list[int]]:
    """Physical block id -> the sequences whose tables hold it (sorted)."""
    out: dict[int, list[int]] = {}
    for seq in sorted(snap["tables"]):
        for b in snap["tables"][seq]:
            out.setdefault(b, []).append(seq)
    return out


def text_color(fill: str) -> str:
    """Black on a light fill, white on a dark one (WCAG relative luminance), so labels stay legible."""
    r, g, b = (int(fill.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4))
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    return "#000" if 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2] > 0.18 else "#fff"


def pool_points(snap: dict, cols: int = 8) -> dict:
    """Where and how each block is drawn: x, y, colour, outline width, label, hover text."""
    held, bs = owners(snap), snap["block_size"]
    pts = {k: [] for k in ("x", "y", "color", "line", "text", "hover")}
    for blk in snap["blocks"]:
        i, who = blk["id"], held.get(blk["id"], [])
        pts["x"].append(i % cols)
        pts["y"].append(i // cols)
        if who:
            color, state = seq_color(who[0]), "held by " + ", ".join(f"seq {s}" for s in who)
        else:
            color, state = (CACHED, "free, cached (findable by a prefix hit)") if blk["cached"] else (FREE, "free")
        pts["color"].append(color)
        pts["line"].append(4 if len(who) > 1 else 1)
        fill = f"{blk['num_tokens']}/{bs}" if who else ("c" if blk["cached"] else "")
        pts["text"].append(fill + (f"<br>x{len(who)}" if len(who) > 1 else ""))  # two lines: fits the square
        pts["hover"].append(f"block {i}: {state}, {blk['num_tokens']}/{bs} slots filled")
    return pts


def waste(snap: dict) -> dict:
    """Token slots holding K/V and slots reserved, in each cache, for the running sequences now.

    A contiguous cache stores every sequence's tokens separately (``used``); the paged pool stores
    a shared block once, so its filled slots (``paged_used``) can be fewer than ``used``.
    """
    used = sum(snap["num_tokens"].values())
    paged_used = sum(b["num_tokens"] for b in snap["blocks"] if b["ref_count"] > 0)
    paged = snap["block_size"] * snap["stats"]["used_blocks"]
    contiguous = snap["max_model_len"] * len(snap["num_tokens"])
    return {"used": used, "paged_used": paged_used, "paged": paged, "contiguous": contiguous,
            "paged_waste": 1 - paged_used / paged if paged else 0.0,
            "contiguous_waste": 1 - used / contiguous if contiguous else 0.0}


def _contiguous_bars(snap: dict) -> dict:
    seqs = sorted(snap["num_tokens"])
    used = [snap["num_tokens"][s] for s in seqs]
    return {"y": [f"seq {s}" for s in seqs], "used": used, "empty": [snap["max_model_len"] - u for u in used],
            "color": [seq_color(s) for s in seqs]}


def pool_figure(trace: list[dict], step: int = 0, cols: int = 8, selected: int | None = None) -> go.Figure:
    """The two caches at ``trace[step]`` (a static figure; :func:`block_pool` animates it)."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.12,
                        subplot_titles=("paged: physical block pool", "contiguous: max_model_len each"))
    # squares smaller than a column (they never touch, even in the book's narrow column), labels
    # large enough to read and coloured for contrast with their block
    fig.add_scatter(row=1, col=1, mode="markers+text", name="blocks", showlegend=False, hoverinfo="text",
                    marker=dict(symbol="square", size=36, line=dict(color="#222")),
                    textfont=dict(size=12, family="Arial Black, Arial, sans-serif"))
    fig.add_bar(row=1, col=2, orientation="h", name="used", showlegend=False)
    fig.add_bar(row=1, col=2, orientation="h", name="reserved, empty", showlegend=False,
                marker=dict(color=EMPTY, line=dict(color="#bbb", width=1), pattern=dict(shape="/")))
    rows = -(-len(trace[0]["blocks"]) // cols)
    style(fig, height=230 + 52 * rows)
    # room for the subplot titles above, and below for the x axis title and then the key
    fig.update_layout(barmode="stack", plot_bgcolor="white", margin=dict(t=92, b=100))
    fig.add_annotation(text=LEGEND.format(bs=trace[0]["block_size"]), xref="paper", yref="paper",
                       x=0, y=0, yanchor="top", yshift=-62,
                       showarrow=False, font=dict(size=11, color="#444"), xanchor="left")
    fig.update_xaxes(row=1, col=1, visible=False, range=[-0.6, cols - 0.4])
    fig.update_yaxes(row=1, col=1, visible=False, range=[rows - 0.5, -0.5])
    fig.update_xaxes(row=1, col=2, title="token slots", range=[0, trace[0]["max_model_len"]])
    fig.update_yaxes(row=1, col=2, autorange="reversed")
    draw(fig, trace[step], cols, selected)
    return fig


def draw(fig, snap: dict, cols: int = 8, selected: int | None = None) -> None:
    """Update the figure's three traces in place to show ``snap``."""
    pts, bars, w = pool_points(snap, cols), _contiguous_bars(snap), waste(snap)
    mine = set(snap["tables"].get(selected, []))
    lines = [SELECTED if b["id"] in mine else "#222" for b in snap["blocks"]]
    widths = [5 if b["id"] in mine else lw for b, lw in zip(snap["blocks"], pts["line"])]
    fig.data[0].update(x=pts["x"], y=pts["y"], text=pts["text"], hovertext=pts["hover"],
                       textfont=dict(color=[text_color(c) for c in pts["color"]]),
                       marker=dict(color=pts["color"], line=dict(color=lines, width=widths)))
    fig.data[1].update(y=bars["y"], x=bars["used"], marker=dict(color=bars["color"]))
    fig.data[2].update(y=bars["y"], x=bars["empty"])
    fig.layout.title.text = (f"step {snap['step']}: paged {w['paged']} slots (waste {w['paged_waste']:.0%}), "
                             f"contiguous {w['contiguous']} (waste {w['contiguous_waste']:.0%})")


def block_table_html(snap: dict, seq: int | None) -> str:
    """The selected sequence's block table: logical block -> physical block, with fill and sharing."""
    if seq is None or seq not in snap["tables"]:
        return "<i>no running sequence selected</i>"
    refs, bs = {b["id"]: b["ref_count"] for b in snap["blocks"]}, snap["block_size"]
    n, cells = snap["num_tokens"][seq], []
    for i, b in enumerate(snap["tables"][seq]):
        filled = min(bs, n - i * bs)
        shared = f" shared x{refs[b]}" if refs[b] > 1 else ""
        cells.append(f"<td style='padding:2px 8px;border:1px solid #ccc'>{i} &rarr; <b>{b}</b>"
                     f"<br>{filled}/{bs}{escape(shared)}</td>")
    return (f"<b style='color:{seq_color(seq)}'>seq {seq}</b> block table ({n} tokens): "
            f"<table style='display:inline-table'><tr>{''.join(cells)}</tr></table>")


def block_pool(trace: list[dict] | None = None, step: int | None = None, cols: int = 8, interval_ms: int = 700) -> Live:
    """Play, step through and inspect a recorded allocator trace (default: :func:`record_trace`).

    ``step`` picks the frame shown first, which is also the static snapshot the book keeps.
    """
    import ipywidgets as W

    trace = trace or record_trace()
    step = len(trace) // 2 if step is None else step
    if not 0 <= step < len(trace):
        raise ValueError(f"step {step} is outside the trace (0..{len(trace) - 1})")
    slider = W.IntSlider(value=step, min=0, max=len(trace) - 1, description="step")
    play = W.Play(value=step, min=0, max=len(trace) - 1, interval=interval_ms, description="play")
    W.jslink((play, "value"), (slider, "value"))
    seq_box = W.Dropdown(description="sequence")
    header, table = W.HTML(), W.HTML()
    plot = None  # drawn below from the first frame's real values, then redrawn on every control change

    def redraw(*_):
        snap = trace[slider.value]
        running = sorted(snap["tables"])
        options = [(f"seq {s}", s) for s in running] or [("(none)", None)]
        if seq_box.options != tuple(options):
            keep = seq_box.value if seq_box.value in running else (running[0] if running else None)
            seq_box.options, seq_box.value = options, keep
        s, w = snap["stats"], waste(snap)
        header.value = (f"<b>step {snap['step']}</b>: {len(running)} running; {s['used_blocks']} of "
                        f"{s['total_blocks']} blocks held, {s['shared_blocks']} shared, {s['cached_blocks']} "
                        f"cached-but-free; waste paged {w['paged_waste']:.0%} vs contiguous "
                        f"{w['contiguous_waste']:.0%}; prefix hit rate so far {s['prefix_hit_rate']:.0%}")
        table.value = block_table_html(snap, seq_box.value)
        if plot is not None:
            draw(plot.figure, snap, cols, seq_box.value)
            plot.update()  # sends the whole figure

    redraw()  # the controls' first values (the sequence box's options) before the figure is built
    plot = LiveFigure(pool_figure(trace, step, cols, seq_box.value))
    slider.observe(redraw, names="value")
    seq_box.observe(redraw, names="value")
    box = W.VBox([W.HBox([play, slider, seq_box]), header, table, plot.widget])
    box.add_class("inferlab-block-pool")
    return Live(box, plot.figure, header=header, description="KV block pool")
