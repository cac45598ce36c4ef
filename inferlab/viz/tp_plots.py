"""Notebook 09's calculator: how many GPUs a model needs, and what tensor parallelism costs at decode.

A decode step of a model split over N GPUs (tensor parallelism, Megatron-LM) takes about

    weights / N / hbm_bandwidth                                    each GPU reads its shard once
  + (2 L + 1) x (latency + 2 (N-1)/N x batch x hidden x 2 / link)  the all-reduces, one after another

Each layer all-reduces twice (after attention's o_proj and the MLP's down_proj) and the embedding
once; a decode all-reduce carries batch x hidden activations (fp16/bf16: 2 bytes each, whatever
the weights' format), and a ring all-reduce moves 2(N-1)/N of them over each GPU's link
(Patarasuk and Yuan 2009). ``latency`` is the fixed cost of one small all-reduce (kernel launch,
synchronisation, the ring's 2(N-1) hops): an assumption the reader can change, not a measurement.
The attention over the KV cache and the compute are left out: at decode the weights dominate.
"""
from __future__ import annotations

import plotly.graph_objects as go

from inferlab.viz.figures import Live, LiveFigure, style
from inferlab.viz.numbers import percent, si

#: name -> (parameters, hidden size, layers): Llama-family shapes.
MODELS = {"Llama-2-7B": (6.74e9, 4096, 32), "Llama-2-13B": (13.0e9, 5120, 40),
          "Llama-2-70B": (70e9, 8192, 80), "Llama-3.1-405B": (405e9, 16384, 126)}
#: name -> (memory bytes, HBM bandwidth bytes/s)
GPUS = {"H100 SXM (80 GB, 3.35 TB/s)": (80e9, 3.35e12), "H200 SXM (141 GB, 4.8 TB/s)": (141e9, 4.8e12),
        "A100 (80 GB, 2.0 TB/s)": (80e9, 2.0e12), "L40S (48 GB, 0.86 TB/s)": (48e9, 0.864e12),
        "RTX 4090 (24 GB, 1.0 TB/s)": (24e9, 1.0e12)}
#: name -> (bytes/s per GPU, latency of one small all-reduce in seconds: an assumption, see above)
LINKS = {"NVLink (900 GB/s, 10 us)": (900e9, 10e-6), "PCIe 5 (64 GB/s, 25 us)": (64e9, 25e-6)}
BYTES_PER_PARAM = {"fp16 / bf16": 2.0, "int8": 1.0, "int4": 0.5, "fp32": 4.0}
DEGREES = [1, 2, 4, 8, 16]
ACT_BYTES = 2  # activations in fp16/bf16
MEMORY_FRACTION = 0.9  # of each GPU's memory the weights may take (vLLM's gpu_memory_utilization default); the rest: KV cache


def decode_step(params: float, bytes_per_param: float, hidden: int, layers: int, batch: int, tp: int,
                hbm_bw: float, link_bw: float, latency_s: float) -> dict:
    """Per-GPU weight bytes and the seconds of one decode step at tensor-parallel degree ``tp``."""
    weights = params * bytes_per_param
    per_gpu = weights / tp
    weight_s = per_gpu / hbm_bw
    n = 2 * layers + 1 if tp > 1 else 0
    message = batch * hidden * ACT_BYTES
    one = latency_s + 2 * (tp - 1) / tp * message / link_bw if tp > 1 else 0.0
    step = weight_s + n * one
    return {"weight_bytes": weights, "per_gpu_bytes": per_gpu, "weight_s": weight_s, "all_reduces": n,
            "bytes_per_all_reduce": message, "all_reduce_s": n * one, "step_s": step,
            "all_reduce_share": n * one / step}


def tp_needed(weight_bytes: float, gpu_memory: float, fraction: float = MEMORY_FRACTION) -> int | None:
    """The smallest power-of-two degree whose weight shard fits in ``fraction`` of one GPU (None: over 16)."""
    return next((n for n in DEGREES if weight_bytes / n <= fraction * gpu_memory), None)


def tp_calculator(model: str = "Llama-2-70B", precision: str = "fp16 / bf16", gpu: str = "H100 SXM (80 GB, 3.35 TB/s)",
                  link: str = "NVLink (900 GB/s, 10 us)", batch: int = 1) -> Live:
    """Model, precision, GPU, interconnect and batch in; the TP degree needed, per-GPU weights, the
    decode step at each degree (HBM time + all-reduce time) and the all-reduce share out."""
    import ipywidgets as W

    wide = {"description_width": "initial"}
    m_box = W.Dropdown(options=list(MODELS), value=model, description="model", style=wide)
    p_box = W.Dropdown(options=list(BYTES_PER_PARAM), value=precision, description="weights", style=wide)
    g_box = W.Dropdown(options=list(GPUS), value=gpu, description="GPU", style=wide)
    l_box = W.Dropdown(options=list(LINKS), value=link, description="interconnect", style=wide)
    b_box = W.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128, 256], value=batch, description="batch",
                              continuous_update=False)
    header = W.HTML()
    labels = [f"TP={n}" for n in DEGREES]

    def state():
        params, hidden, layers = MODELS[m_box.value]
        mem, hbm = GPUS[g_box.value]
        link_bw, latency = LINKS[l_box.value]
        rows = [decode_step(params, BYTES_PER_PARAM[p_box.value], hidden, layers, b_box.value, n, hbm, link_bw, latency)
                for n in DEGREES]
        need = tp_needed(rows[0]["weight_bytes"], mem)
        ms = [1e3 * r["weight_s"] for r in rows], [1e3 * r["all_reduce_s"] for r in rows]
        no_fit = [(lab, w + a) for lab, w, a, r in zip(labels, *ms, rows) if r["per_gpu_bytes"] > MEMORY_FRACTION * mem]
        if need is None:
            header.value = (f"<b>{si(rows[0]['weight_bytes'], 'B')}</b> of weights do not fit in 16 GPUs of "
                            f"{si(mem, 'B')}: more GPUs (pipeline parallelism across nodes) or fewer bytes per weight")
        else:
            r = rows[DEGREES.index(need)]
            comm = (f"{r['all_reduces']} all-reduces of {si(r['bytes_per_all_reduce'], 'B')}: "
                    f"<b>{percent(r['all_reduce_share'])}</b> of the step" if r["all_reduces"] else "one GPU: no all-reduce")
            best = min(rows[DEGREES.index(need):], key=lambda x: x["step_s"])
            fastest = DEGREES[rows.index(best)]
            header.value = (f"{si(r['weight_bytes'], 'B')} of weights on GPUs of {si(mem, 'B')}: <b>TP = {need}</b> "
                            f"at least ({si(r['per_gpu_bytes'], 'B')} of weights per GPU, under {percent(MEMORY_FRACTION)} "
                            f"of its memory). Decode step at TP = {need}: <b>{1e3 * r['step_s']:.3g} ms</b> ({comm}). "
                            f"Fastest: TP = {fastest}, {1e3 * best['step_s']:.3g} ms, all-reduces "
                            f"{percent(best['all_reduce_share'])} of it.")
        title = f"{m_box.value}, {p_box.value}, batch {b_box.value}: one decode step at each TP degree"
        traces = {0: {"x": labels, "y": ms[0]}, 1: {"x": labels, "y": ms[1]},
                  2: {"x": [x for x, _ in no_fit], "y": [y for _, y in no_fit]}}
        return traces, title

    traces, title = state()
    fig = go.Figure([go.Bar(name="read this GPU's weights from HBM", **traces[0]),
                     go.Bar(name="all-reduces (2 per layer + 1)", **traces[1]),
                     go.Scatter(name="weights do not fit on one GPU", mode="markers",
                                marker=dict(symbol="x", size=14, color="#d62728"), **traces[2])])
    fig.update_layout(barmode="stack", yaxis=dict(title="milliseconds per decode step"),
                      xaxis=dict(title="tensor-parallel degree (GPUs)", type="category"))
    plot = LiveFigure(style(fig, title, height=420))

    def redraw(*_):
        traces, title = state()
        plot.update(traces, {"title.text": title})

    for w in (m_box, p_box, g_box, l_box, b_box):
        w.observe(redraw, names="value")
    box = W.VBox([W.HBox([m_box, p_box]), W.HBox([g_box, l_box]), b_box, header, plot.widget])
    return Live(box, plot.figure, header=header, description="tensor-parallel calculator")
