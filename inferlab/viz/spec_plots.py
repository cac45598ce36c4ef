"""Notebook 04's figures: speculative decoding step by step, acceptance, speedups, the batch crossover.

``trace`` runs the single-sequence speculative loop of ``inferlab.spec.reference`` for a fixed
number of verify steps and records, per step, the proposer's guesses and the tokens the verifier
emitted; ``token_view`` shows that live (a prompt, a method, k and a temperature to pick) with
accepted guesses green, rejected ones red and the verifier's own token (resampled at a rejection,
or the bonus after a full accept) blue.
"""
from __future__ import annotations

import plotly.graph_objects as go
import torch

from inferlab.cache import ContiguousKVCache
from inferlab.sampling import SamplingParams, make_generator, probs_from_logits
from inferlab.spec.ngram import NgramProposer
from inferlab.spec.reference import DraftModelProposer, _forward
from inferlab.spec.rejection import greedy_verify, rejection_sample
from inferlab.viz.figures import Live, LiveFigure, escape, style

GREEN, RED, BLUE = "#2ca02c", "#d62728", "#1f77b4"


@torch.inference_mode()
def trace(target, prompt_ids: list[int], proposer, params: SamplingParams, steps: int = 16) -> list[dict]:
    """``steps`` verify steps after the prompt: [{"guesses": [...], "emitted": [...]}, ...]."""
    ngram = isinstance(proposer, NgramProposer)
    k = proposer.num_speculative_tokens if ngram else proposer.k
    total = len(prompt_ids) + steps * (k + 1) + 2
    cache = ContiguousKVCache.for_model(target.config, 1, total, target.dtype, target.device)
    if not ngram:
        proposer.start(total)
    gen = make_generator(params.seed, target.device)
    p = probs_from_logits(_forward(target, list(prompt_ids), cache, 0)[-1], params)
    tokens = list(prompt_ids) + rejection_sample([[]], p[None], None, [gen])[0]
    rows = []
    for _ in range(steps):
        q = None
        if ngram:
            guesses = proposer.propose(tokens)
        else:
            guesses, q = proposer.propose(tokens, params, gen)
        logits = _forward(target, [tokens[-1]] + guesses, cache, len(tokens) - 1)
        if params.greedy:
            emitted = greedy_verify([guesses], logits.argmax(-1))[0]
        else:
            emitted = rejection_sample([guesses], probs_from_logits(logits, params), q, [gen])[0]
        rows.append({"guesses": list(guesses), "emitted": list(emitted)})
        tokens += emitted
        if not ngram:
            proposer.rollback(len(tokens) - 1)
    return rows


def counts(rows: list[dict]) -> dict[str, list[int]]:
    """Per step: guesses accepted, guesses rejected (the first one refused and the ones after it),
    and the verifier's own token (always 1)."""
    acc = [len(r["emitted"]) - 1 for r in rows]
    return {"accepted": acc, "rejected": [len(r["guesses"]) - a for r, a in zip(rows, acc)],
            "from the target": [1] * len(rows)}


def _span(text: str, color: str, strike: bool = False) -> str:
    deco = "text-decoration:line-through;opacity:0.75;" if strike else ""
    return f'<span style="background:{color}33;border-bottom:2px solid {color};{deco}">{escape(text)}</span>'


def tokens_html(rows: list[dict], decode, prompt: str) -> str:
    """The prompt in grey, then each step: accepted guesses (green), rejected ones struck through
    (red), the verifier's token (blue); a thin bar between steps."""
    parts = [f'<span style="color:#888">{escape(prompt)}</span>']
    for r in rows:
        n = len(r["emitted"]) - 1
        parts += [_span(decode([t]), GREEN) for t in r["guesses"][:n]]
        parts += [_span(decode([t]), RED, strike=True) for t in r["guesses"][n:]]
        parts += [_span(decode([r["emitted"][-1]]), BLUE), '<span style="color:#bbb">|</span>']
    legend = (f"{_span('accepted guess', GREEN)} {_span('rejected guess', RED, strike=True)} "
              f"{_span('drawn by the verifier (resampled or bonus)', BLUE)} <span style='color:#bbb'>|</span> end of a step")
    return (f"<div style='font-size:90%'>{legend}</div><div style='font-family:monospace;white-space:pre-wrap;"
            f"line-height:1.7;border:1px solid #ddd;padding:6px'>{''.join(parts)}</div>")


def steps_figure(rows: list[dict], title: str) -> go.Figure:
    c = counts(rows)
    x = list(range(1, len(rows) + 1))
    fig = go.Figure([go.Bar(x=x, y=c[name], name=name, marker_color=color)
                     for name, color in (("accepted", GREEN), ("from the target", BLUE), ("rejected", RED))])
    fig.update_layout(barmode="stack", xaxis=dict(title="verify step (one target forward)", dtick=1),
                      yaxis=dict(title="tokens"))
    return style(fig, title, height=330)


def token_view(target, tokenizer, prompts: dict[str, str], drafts: dict, k: int = 4, steps: int = 16,
               seed: int = 0) -> Live:
    """Pick a prompt, a proposer (``drafts``: label -> "ngram" or a draft model), k and a temperature;
    see every verify step's guesses and what the verifier did with them."""
    import ipywidgets as W

    pick = W.Dropdown(options=list(prompts), description="prompt")
    method = W.Dropdown(options=list(drafts), description="proposer", style={"description_width": "initial"})
    k_box = W.IntSlider(value=k, min=1, max=8, description="k", continuous_update=False)
    temp = W.Dropdown(options=[0.0, 0.7, 1.0], value=0.0, description="temperature",
                      style={"description_width": "initial"})
    header = W.HTML()

    def state():
        draft = drafts[method.value]
        proposer = (NgramProposer(k_box.value, 1, 4) if draft == "ngram" else DraftModelProposer(draft, k_box.value))
        params = SamplingParams(temperature=temp.value, seed=seed, max_tokens=steps * (k_box.value + 1))
        text = prompts[pick.value]
        rows = trace(target, tokenizer.encode(text), proposer, params, steps)
        c = counts(rows)
        guessed, kept = sum(c["accepted"]) + sum(c["rejected"]), sum(c["accepted"])
        emitted = sum(len(r["emitted"]) for r in rows)
        header.value = (f"<b>{kept} of {guessed}</b> guesses accepted; <b>{emitted}</b> tokens from {steps} target "
                        f"forwards ({emitted / steps:.2f} per forward; plain decoding: 1)" + tokens_html(rows, tokenizer.decode, text))
        title = f"{method.value}, k = {k_box.value}, temperature {temp.value}: what each verify step kept"
        return {i: {"y": c[name]} for i, name in enumerate(("accepted", "from the target", "rejected"))}, title, rows

    traces, title, rows = state()
    plot = LiveFigure(steps_figure(rows, title))

    def redraw(*_):
        traces, title, _ = state()
        plot.update(traces, {"title.text": title})

    for w in (pick, method, k_box, temp):
        w.observe(redraw, names="value")
    box = W.VBox([W.HBox([pick, method]), W.HBox([k_box, temp]), header, plot.widget])
    return Live(box, plot.figure, header=header, description="speculative decoding, token by token")


def acceptance_figure(lengths: dict[str, dict[int, float]], predicted: dict[str, dict[int, float]]) -> go.Figure:
    """Tokens per verify step against k: measured (markers) and Leviathan's prediction (dashed)."""
    fig = go.Figure()
    for name, by_k in lengths.items():
        fig.add_scatter(x=list(by_k), y=list(by_k.values()), mode="lines+markers", name=f"{name}, measured")
    for name, by_k in predicted.items():
        fig.add_scatter(x=list(by_k), y=list(by_k.values()), mode="lines", line=dict(dash="dash"),
                        name=f"{name}, (1 - a^(k+1)) / (1 - a)")
    fig.update_layout(xaxis=dict(title="k (guesses per step)", dtick=1), yaxis=dict(title="tokens per target forward"))
    return style(fig, "Tokens per verify step against k", height=420)


def speedup_figure(rows: list[dict], goals: dict[str, float]) -> go.Figure:
    """Batch 1, one panel per prompt set: each method's measured decode speedup beside the one
    Leviathan's formula predicts from the engine's own steps, and the whole run's (prefill
    included); the set's goal dashed. ``rows``: ``bench.spec.engine_table`` rows at batch 1, each
    with its ``prompt_set``."""
    from plotly.subplots import make_subplots

    sets = list(dict.fromkeys(r["prompt_set"] for r in rows))
    fig = make_subplots(rows=1, cols=len(sets), subplot_titles=[f"{s} prompts" for s in sets], shared_yaxes=True)
    bars = (("decode steps, measured", lambda r: r["engine"]["measured_decode_speedup"], BLUE),
            ("decode steps, predicted (a, c, v)", lambda r: r["engine"]["predicted_decode_speedup"], "#9ecae1"),
            ("whole run, prefill included", lambda r: r["speedup"], "#7f7f7f"))
    for col, name in enumerate(sets, 1):
        mine = [r for r in rows if r["prompt_set"] == name]
        labels = [f"{r['method']} k={r['num_speculative_tokens']}" for r in mine]
        for label, value, color in bars:
            fig.add_bar(x=labels, y=[value(r) for r in mine], name=label, marker_color=color, legendgroup=label,
                        showlegend=col == 1, row=1, col=col)
        fig.add_hline(y=1, line_color="#555", row=1, col=col)
        if name in goals:
            fig.add_hline(y=goals[name], line_dash="dash", line_color=RED, annotation_text=f"goal {goals[name]}x",
                          annotation_position="top left", row=1, col=col)
    fig.update_layout(barmode="group", yaxis=dict(title="speedup over plain decoding"))
    return style(fig, "smollm2, batch 1: measured speedup beside Leviathan's prediction", height=420)


def crossover_figure(rows: list[dict]) -> go.Figure:
    """The decode steps' speedup against the batch size, one colour per method: measured (solid,
    markers) and the steps it saved the batch, plain steps over speculative ones (dashed, same
    colour): the speedup if a verify step cost no more than a plain one. ``rows``:
    ``bench.spec.engine_table`` rows."""
    from inferlab.viz.kv_blocks import PALETTE

    fig = go.Figure()
    names = list(dict.fromkeys(f"{r['method']} k={r['num_speculative_tokens']}" for r in rows))
    for name, color in zip(names, PALETTE):
        mine = [r for r in rows if f"{r['method']} k={r['num_speculative_tokens']}" == name]
        x = [r["batch_size"] for r in mine]
        fig.add_scatter(x=x, y=[r["engine"]["measured_decode_speedup"] for r in mine], mode="lines+markers",
                        name=f"{name}, measured", line=dict(color=color), legendgroup=name)
        fig.add_scatter(x=x, y=[r["baseline_steps"] / r["steps"] for r in mine], mode="lines+markers",
                        name=f"{name}, steps saved", line=dict(color=color, dash="dash"), marker=dict(symbol="circle-open"),
                        legendgroup=name)
    fig.add_hline(y=1, line_dash="dot", line_color="#555", annotation_text="no speculation",
                  annotation_position="bottom left")
    batches = sorted({r["batch_size"] for r in rows})
    style(fig, "Through the engine: speculation's speedup as the batch fills", height=420, log_x=True)
    fig.update_xaxes(title="batch size (sequences decoding together)", tickvals=batches,
                     ticktext=[str(b) for b in batches], dtick=None, minor=dict(ticks=""))
    fig.update_yaxes(title="decode steps: speedup over no speculation")
    return fig
