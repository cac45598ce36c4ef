"""Notebook 05's figures: what the scheduler did at every step, recorded from the real engine.

``run_traced`` adds a workload to an ``LLMEngine`` and steps it to the end with a step hook
(``engine.step_hooks``) that keeps each step's record: which requests ran, a prefill (or a chunk
of one) or a decode, who was preempted, and the KV pool's usage. The figures read only that
trace: a Gantt timeline of requests per step, batch occupancy, TTFT and TPOT counted in steps
(deterministic, unlike seconds), and KV usage per step. ``timeline_view`` switches between runs.
"""
from __future__ import annotations

import time

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from inferlab.sampling import SamplingParams
from inferlab.viz.figures import Live, LiveFigure, style

STATES = {"waiting": "#d9d9d9", "prefill": "#ff7f0e", "prefill chunk": "#ffbb78", "decode": "#1f77b4"}
POLICY_COLORS = {"static": "#d62728", "continuous": "#2ca02c"}


def run_traced(llm, workload: list[dict], snapshots: bool = False) -> dict:
    """Run ``workload`` (``make_workload``'s dicts, all arriving now) through ``llm``'s engine (or
    an ``LLMEngine``),
    greedy with exact output lengths. Returns the per-step ``records`` (``LLMEngine.step_record``
    plus ``kv_usage``, ``wall_s``: the whole ``step()`` call, and a ``snapshot`` of the block pool
    when asked), per-request results and the wall time."""
    engine = getattr(llm, "llm_engine", llm)
    records: list[dict] = []

    def hook(eng, record):
        record["kv_usage"] = eng.kv_cache_stats()["usage"]
        if snapshots:
            snap = eng.block_manager.snapshot()
            snap.update(step=len(records), running=sorted(snap["tables"]), max_model_len=eng.config.max_model_len,
                        stats=eng.block_manager.stats())
            record["snapshot"] = snap
        records.append(record)

    ids = []
    for i, w in enumerate(workload):
        rid = f"r{i}"
        ids.append(rid)
        engine.add_request(rid, w["prompt"], SamplingParams(temperature=0, max_tokens=w["max_tokens"], ignore_eos=True))
    first, finals = {}, {}
    engine.step_hooks.append(hook)
    t0 = time.perf_counter()
    try:
        while engine.has_unfinished_requests():
            t = time.perf_counter()
            outputs = engine.step()
            records[-1]["wall_s"] = time.perf_counter() - t  # the whole step: scheduling and outputs too
            for o in outputs:
                if o.request_id not in first and o.outputs[0].token_ids:
                    first[o.request_id] = len(records) - 1
                if o.finished:
                    finals[o.request_id] = (len(records) - 1, o)
    finally:
        engine.step_hooks.remove(hook)
    elapsed = time.perf_counter() - t0
    requests = {}
    for rid in ids:
        end, o = finals[rid]
        n = len(o.outputs[0].token_ids)
        m = o.metrics
        requests[rid] = {"prompt_tokens": len(o.prompt_token_ids), "output_tokens": n, "token_ids": o.outputs[0].token_ids,
                         "ttft_steps": first[rid] + 1, "finish_step": end,
                         "tpot_steps": (end - first[rid]) / (n - 1) if n > 1 else None,
                         "ttft_s": m.first_token_time - m.arrival_time,
                         "tpot_s": (m.finished_time - m.first_token_time) / (n - 1) if n > 1 else None}
    out_tokens = sum(r["output_tokens"] for r in requests.values())
    return {"policy": engine.config.batching_policy, "max_num_seqs": engine.config.max_num_seqs,
            "records": records, "requests": requests, "num_steps": len(records), "elapsed_s": elapsed,
            "output_tokens": out_tokens, "tokens_per_s": out_tokens / elapsed,
            "num_preemptions": sum(len(r["preempted"]) for r in records)}


def best_of_rounds(rounds: list[dict]) -> dict:
    """Tokens/s of one policy from several rounds of the same workload, robust to a busy machine.

    The schedule is deterministic (all requests arrive at once; greedy, exact lengths), so step i
    does the same work in every round: its cost is the fastest of its rounds (a timing can only be
    slowed by other processes, never sped up), and the run's time is the sum over its steps. Keeps
    the first round's records with ``wall_s`` replaced by that minimum."""
    shapes = {tuple(tuple((row["request_id"], row["num_new_tokens"]) for row in rec["scheduled"]) for rec in r["records"])
              for r in rounds}
    if len(shapes) != 1:
        raise ValueError("the rounds scheduled different steps: best_of_rounds needs a deterministic schedule")
    wall = [min(r["records"][i]["wall_s"] for r in rounds) for i in range(rounds[0]["num_steps"])]
    records = [dict(rec, wall_s=w) for rec, w in zip(rounds[0]["records"], wall)]
    tokens = rounds[0]["output_tokens"]
    return dict(rounds[0], records=records, elapsed_s=sum(wall), tokens_per_s=tokens / sum(wall),
                round_tokens_per_s=[r["tokens_per_s"] for r in rounds])


def states(run: dict) -> dict[str, list[str | None]]:
    """Request id -> its state at every step: a STATES key, or None once finished."""
    n = run["num_steps"]
    table = {rid: ["waiting"] * (r["finish_step"] + 1) + [None] * (n - r["finish_step"] - 1)
             for rid, r in run["requests"].items()}
    for rec in run["records"]:
        for row in rec["scheduled"]:
            kind = "prefill chunk" if row["chunk"] else row["kind"]
            table[row["request_id"]][rec["step"]] = kind
    return table


def segments(run: dict) -> list[dict]:
    """Runs of one state per request: ``{"request_id", "state", "start", "length"}`` (in steps)."""
    out = []
    for rid, row in states(run).items():
        start = 0
        for s in range(1, len(row) + 1):
            if s == len(row) or row[s] != row[start]:
                if row[start] is not None:
                    out.append({"request_id": rid, "state": row[start], "start": start, "length": s - start})
                start = s
    return out


def timeline_figure(run: dict, title: str | None = None) -> go.Figure:
    """Gantt chart: one row per request, a bar per run of steps in one state; x marks preemptions."""
    fig = go.Figure()
    _timeline_traces(fig)
    _fill_timeline(fig, run, title)
    return fig


def _timeline_traces(fig) -> None:
    for name, color in STATES.items():
        fig.add_bar(orientation="h", name=name, marker=dict(color=color, line=dict(width=0)), hoverinfo="text")
    fig.add_scatter(mode="markers", name="preempted", marker=dict(symbol="x", size=10, color="#000"))
    style(fig, height=440)
    fig.update_layout(barmode="overlay", bargap=0.25, plot_bgcolor="white", legend=dict(orientation="h", y=-0.15),
                      xaxis=dict(title="engine step", rangemode="tozero"), yaxis=dict(title="request", autorange="reversed"))


def _fill_timeline(fig, run: dict, title: str | None) -> None:
    segs = segments(run)
    order = list(run["requests"])
    for trace, name in zip(fig.data, STATES):
        mine = [s for s in segs if s["state"] == name]
        trace.update(y=[s["request_id"] for s in mine], base=[s["start"] for s in mine], x=[s["length"] for s in mine],
                     hovertext=[f"{s['request_id']}: {name}, steps {s['start']}-{s['start'] + s['length'] - 1}" for s in mine])
    pre = [(rec["step"], rid) for rec in run["records"] for rid in rec["preempted"]]
    fig.data[-1].update(x=[s + 0.5 for s, _ in pre], y=[r for _, r in pre])
    fig.layout.yaxis.update(categoryorder="array", categoryarray=order)
    fig.layout.title.text = title or f"{run['policy']} batching: {run['num_steps']} steps, max_num_seqs {run['max_num_seqs']}"


def batch_sizes(run: dict) -> list[int]:
    """Sequences in each step's batch."""
    return [len(rec["scheduled"]) for rec in run["records"]]


def occupancy_figure(runs: dict[str, dict]) -> go.Figure:
    """Sequences per step for each run, with the max_num_seqs line."""
    fig = go.Figure()
    for name, run in runs.items():
        sizes = batch_sizes(run)
        fig.add_scatter(x=list(range(len(sizes))), y=sizes, mode="lines", line=dict(shape="hv", color=POLICY_COLORS.get(name)),
                        name=f"{name} (mean {sum(sizes) / len(sizes):.2f})")
    cap = max(r["max_num_seqs"] for r in runs.values())
    fig.add_hline(y=cap, line_dash="dash", annotation_text="max_num_seqs")
    style(fig, "Batch occupancy: sequences in each step", 340)
    fig.update_layout(xaxis=dict(title="engine step"), yaxis=dict(title="sequences", range=[0, cap + 0.5]))
    return fig


def latency_figure(runs: dict[str, dict]) -> go.Figure:
    """TTFT and TPOT per request, in engine steps (box + every point), for each run."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT (steps until the first token)", "TPOT (steps per later token)"))
    for name, run in runs.items():
        reqs = run["requests"].values()
        for col, key in ((1, "ttft_steps"), (2, "tpot_steps")):
            ys = [r[key] for r in reqs if r[key] is not None]
            fig.add_box(y=ys, name=name, boxpoints="all", jitter=0.4, pointpos=0, row=1, col=col,
                        marker=dict(color=POLICY_COLORS.get(name)), showlegend=False)
    style(fig, "TTFT and TPOT per request, in engine steps", 400)
    fig.update_yaxes(title="steps", rangemode="tozero")
    return fig


def kv_usage_figure(runs: dict[str, dict]) -> go.Figure:
    """Share of the KV pool's blocks held after each step; an x marks each step that preempted,
    labelled with how many sequences it preempted when more than one."""
    fig = go.Figure()
    for name, run in runs.items():
        use = [rec["kv_usage"] for rec in run["records"]]
        fig.add_scatter(x=list(range(len(use))), y=use, mode="lines", name=name, line=dict(shape="hv", color=POLICY_COLORS.get(name)))
        pre = [(rec["step"], len(rec["preempted"])) for rec in run["records"] if rec["preempted"]]
        if pre:
            fig.add_scatter(x=[s for s, _ in pre], y=[use[s] for s, _ in pre], mode="markers+text",
                            name=f"{name}: a step that preempted (x2: two sequences)",
                            text=[f"x{n}" if n > 1 else "" for _, n in pre], textposition="bottom center",
                            marker=dict(symbol="x", size=10, color="#000"))
    style(fig, "KV pool usage per step", 340)
    fig.update_layout(xaxis=dict(title="engine step"), yaxis=dict(title="blocks held / pool", range=[0, 1.05], tickformat=".0%"),
                      legend=dict(orientation="h", y=-0.25))
    return fig


def timeline_view(runs: dict[str, dict], first: str | None = None) -> Live:
    """Pick a run; its Gantt timeline redraws, with the step count, occupancy and preemptions above.

    Every run is drawn on the same step axis (the longest run's), so switching compares them by
    eye; the book's static snapshot shows every run, one under the other."""
    import ipywidgets as W

    names = list(runs)
    pick = W.ToggleButtons(options=names, value=first or names[0], description="policy")
    header = W.HTML()
    steps = max(run["num_steps"] for run in runs.values())
    live = LiveFigure(timeline_figure(runs[pick.value]))

    def redraw(*_):
        run = runs[pick.value]
        sizes = batch_sizes(run)
        new = timeline_figure(run)
        traces = {i: {k: v for k, v in t.to_plotly_json().items() if k != "type"} for i, t in enumerate(new.data)}
        live.update(traces, {"title.text": new.layout.title.text, "yaxis.categoryarray": list(run["requests"]),
                             "xaxis.range": [0, steps], "xaxis.autorange": False})
        header.value = (f"<b>{run['policy']}</b>: {run['num_steps']} steps for {len(run['requests'])} requests, "
                        f"mean batch {sum(sizes) / len(sizes):.2f} of {run['max_num_seqs']}, "
                        f"{run['num_preemptions']} preemptions")

    pick.observe(redraw, names="value")
    redraw()
    book = []
    for name in names:
        fig = timeline_figure(runs[name])
        fig.update_layout(xaxis=dict(range=[0, steps], autorange=False))
        book.append(fig)
    return Live(W.VBox([pick, header, live.widget]), live.figure, header=header, description="batching timeline",
                snapshots=book)


def throughput_figure(runs: dict[str, dict], step_ratio: float, decode_s: dict[int, float]) -> go.Figure:
    """Measured throughput: each policy's tokens/s (``best_of_rounds``' estimate as a bar, every
    whole round as a dot), the tokens/s ratio beside the step ratio, and a decode step's time by
    the number of sequences in it."""
    fig = make_subplots(rows=1, cols=3, column_widths=[0.36, 0.3, 0.34], horizontal_spacing=0.1,
                        subplot_titles=("output tokens/s", "continuous over static", "a decode step's time"))
    names = list(runs)
    fig.add_bar(x=names, y=[runs[k]["tokens_per_s"] for k in names], name="tokens/s, fastest round of each step",
                row=1, col=1, marker=dict(color=[POLICY_COLORS.get(k, "#888") for k in names]), showlegend=False)
    fig.add_scatter(x=[k for k in names for _ in runs[k]["round_tokens_per_s"]],
                    y=[v for k in names for v in runs[k]["round_tokens_per_s"]], mode="markers",
                    name="tokens/s, each whole round", row=1, col=1, showlegend=False,
                    marker=dict(color="#000", size=7, symbol="circle-open"))
    ratios = {"fewer steps": step_ratio, "more tokens/s": runs["continuous"]["tokens_per_s"] / runs["static"]["tokens_per_s"]}
    fig.add_bar(x=list(ratios), y=list(ratios.values()), name="ratio", row=1, col=2, showlegend=False,
                marker=dict(color=["#7f7f7f", POLICY_COLORS["continuous"]]),
                text=[f"{v:.2f}x" for v in ratios.values()], textposition="outside")
    fig.add_hline(y=1, line_dash="dash", line_color="#555", row=1, col=2)
    sizes = list(decode_s)
    fig.add_scatter(x=sizes, y=[decode_s[b] * 1e3 for b in sizes], mode="lines+markers", name="ms per decode step",
                    row=1, col=3, showlegend=False, line=dict(color="#1f77b4"))
    style(fig, "Measured in one run: throughput of both policies", 380)
    fig.update_yaxes(title="tokens/s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title="ratio", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title="ms", rangemode="tozero", row=1, col=3)
    fig.update_xaxes(title="sequences in the step", dtick=1, row=1, col=3)
    return fig
