"""inferlab.viz: offline diagrams, figures with a static twin, the calculator, notebook helpers."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("plotly")
pytest.importorskip("ipywidgets")

import plotly.graph_objects as go  # noqa: E402
import torch  # noqa: E402

from inferlab import roofline, viz  # noqa: E402
from inferlab.viz import notebook as nb_helpers  # noqa: E402


def test_mermaid_never_calls_the_web_service(monkeypatch):
    import mermaid

    def refuse(*args, **kwargs):
        raise AssertionError("mermaid.Mermaid(...) sends the diagram to a web service")

    monkeypatch.setattr(mermaid.Mermaid, "__init__", refuse)
    chart = viz.flowchart("t", nodes=[("a", "A"), ("b", "B: two")], edges=[("a", "b", "go")],
                          links={"b": "02_kv_cache.ipynb"})
    bundle = viz.mermaid(chart)._repr_mimebundle_()
    assert set(bundle) == {"text/vnd.mermaid", "text/markdown", "text/plain"}
    script = bundle["text/vnd.mermaid"]
    assert script.startswith("flowchart LR") and "---" not in script  # no front matter for MyST to misread
    assert 'a -->|"go"| b' in script and 'click b "02_kv_cache.ipynb"' in script
    assert bundle["text/markdown"] == f"```mermaid\n{script}```\n"


def test_figure_html_loads_only_local_plotly_and_is_reproducible():
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]), layout=dict(title="a </script> title"))
    first, second = viz.figure_html(fig), viz.figure_html(fig)
    assert viz.PLOTLY_JS_PATH in first and "cdn" not in first.lower()
    assert not re.search(r"""src=["']https?:""", first)
    assert "</script> title" not in first  # a string in the figure cannot close the script tag
    ids = [re.search(r'id="(inferlab-fig-[0-9a-f]{10})-\d+"', h).group(1) for h in (first, second)]
    assert ids[0] == ids[1]  # same content, same id stem: nbval can compare the stored HTML
    bundle = viz.show(fig)._repr_mimebundle_()
    assert set(bundle) == {"application/vnd.plotly.v1+json", "text/html", "text/plain"}


def test_calculator_bundle_and_controls_redraw_the_figure():
    live = viz.roofline_calculator(roofline.PRESETS, params_b=70, bits=16, batch=1, start="H100 SXM")
    bundle = live._repr_mimebundle_()
    assert {"application/vnd.jupyter.widget-view+json", "text/html", "text/plain"} <= set(bundle)
    assert "23.9 tokens/s" in bundle["text/html"] and "140 GB" in bundle["text/html"]
    assert "snapshot" in bundle["text/html"] and "JupyterLab" in bundle["text/html"]
    assert "model_id" not in bundle["text/plain"]
    controls = {c.description: c for row in live.widget.children[:2] for c in row.children}
    decode = live.figure.data[1]
    x_before = decode.x[0]
    controls["batch"].value = 64
    assert live.figure.data[1].x[0] == pytest.approx(64 * x_before)
    assert "batch of 64" in live.header.value
    controls["precision"].value = 4
    assert "35 GB" in live.header.value
    controls["hardware"].value = "H200 SXM"
    assert live.figure.data[0].name == "H200 SXM roofline"


def test_roofline_figure_marks_points():
    hw = roofline.PRESETS["A100 80GB SXM"]
    fig = viz.roofline_figure(hw, [{"name": "p", "intensity": 1.0, "flops": 1e12}])
    xs, ys = fig.data[0].x, fig.data[0].y
    assert max(ys) == hw.peak_flops and hw.ridge_point in xs
    assert fig.data[1].name == "p"
    assert viz.attainable_flops(hw, 1.0) == hw.mem_bandwidth


def test_seed_everything_repeats_random_draws():
    viz.seed_everything(3)
    a = torch.randn(4)
    viz.seed_everything(3)
    assert torch.equal(a, torch.randn(4))


def test_progress_honours_tqdm_disable(monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert viz.progress(range(3)).disable
    assert list(viz.progress(range(3))) == [0, 1, 2]


def test_demo_model_prefers_the_embedded_target(tmp_path, monkeypatch):
    (tmp_path / "target").mkdir()
    monkeypatch.setattr(nb_helpers, "EMBEDDED_TARGET", tmp_path / "target")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fallback = viz.demo_model()  # no config.json yet: the tiny random model
    assert fallback.startswith(str(tmp_path / "cache"))
    from inferlab import LLM, SamplingParams
    llm = LLM(model=fallback, device="cpu")
    out = llm.generate(["def f(x):"], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3
    (tmp_path / "target" / "config.json").write_text("{}")
    assert viz.demo_model() == "target"


def test_calculator_places_measured_points_on_their_hardware():
    hardware = {**roofline.PRESETS, "mine": roofline.Hardware("mine", 1e11, 1e10, 1e9)}
    live = viz.roofline_calculator(hardware, start="H100 SXM")
    live.place("mine", [{"name": "decode", "intensity": 0.5, "flops": 1e9}])
    assert live.figure.data[3].x == ()  # shown only on the hardware they were measured on
    controls = {c.description: c for row in live.widget.children[:2] for c in row.children}
    controls["hardware"].value = "mine"
    assert live.figure.data[3].x == (0.5,) and live.figure.data[3].text == ("decode",)


def _sent_figure(live):
    """The figure as the browser receives it: the plotly JSON in the Output widget's state."""
    (output,) = live.widget.children[-1].outputs
    return output["data"]["application/vnd.plotly.v1+json"]


def _assert_every_trace_has_points(fig_json, when):
    for trace in fig_json["data"]:
        for axis in ("x", "y"):
            values = trace.get(axis)
            assert values is not None, f"{when}: {trace.get('name')} has no {axis}"
            assert all(isinstance(v, (int, float)) and v > 0 for v in values), (when, trace.get("name"), values)


def test_calculator_sends_whole_figures_from_its_first_view():
    live = viz.roofline_calculator(roofline.PRESETS, params_b=70, bits=16, batch=1, start="H100 SXM")
    first = _sent_figure(live)  # what JupyterLab draws before any control moves
    _assert_every_trace_has_points(first, "first view")
    assert first["data"][1]["name"] == "decode step" and first["data"][1]["x"] == [1.0]
    assert first["data"][1]["y"] == [roofline.PRESETS["H100 SXM"].mem_bandwidth]  # on the memory slope
    controls = {c.description: c for row in live.widget.children[:2] for c in row.children}
    for name, value in [("hardware", "H200 SXM"), ("params (B)", 10 ** 0.85), ("batch", 8), ("precision", 4)]:
        controls[name].value = value
        _assert_every_trace_has_points(_sent_figure(live), f"after {name}")
    sent = _sent_figure(live)
    assert sent["data"][1]["x"] == [32.0] and sent["data"][1]["y"] == [32 * roofline.PRESETS["H200 SXM"].mem_bandwidth]
    assert "7.08B parameters" in live.header.value and "7.08B params" in sent["layout"]["title"]["text"]
    assert not any(isinstance(w, go.FigureWidget) for w in live.widget.children)  # no anywidget to time out


def test_numbers_read_like_a_person_wrote_them():
    from inferlab.viz import numbers

    assert numbers.count(10 ** 9.85) == "7.08B" and numbers.count(70e9) == "70B"
    assert numbers.count(5.57e6) == "5.57M" and numbers.count(999.7e6) == "1B" and numbers.count(512) == "512"
    assert numbers.si(140e9, "B") == "140 GB" and numbers.si(989e12, "FLOP/s") == "989 TFLOP/s"
    assert numbers.number(23.93) == "23.9" and numbers.number(12138) == "12,138" and numbers.number(0.5) == "0.5"
    assert numbers.percent(1.189) == "119%"


def test_points_above_the_roof_are_labelled():
    hw = roofline.Hardware("mine", 60e9, 50e9, 1e9)
    points = [{"name": "prefill", "intensity": 128.0, "flops": 71e9}, {"name": "decode", "intensity": 0.5, "flops": 3e9}]
    fig = viz.roofline_figure(hw, points)
    assert "above" in fig.data[1].name and "118%" in fig.data[1].name
    assert fig.data[2].name == "decode"
    assert [p["name"] for p in viz.roofline_plot.above_roof(hw, points)] == ["prefill"]
    live = viz.roofline_calculator({"mine": hw}, start="mine", measured={"mine": points})
    assert "Above the roof: prefill" in live.header.value


def test_figures_keep_the_title_clear_of_the_mode_bar():
    fig = viz.roofline_figure(roofline.PRESETS["H100 SXM"])
    title = fig.layout.title
    assert title.xanchor == "left" and title.yref == "container"
    assert (1 - title.y) * fig.layout.height >= viz.figures.MODEBAR_PX  # below the mode bar's row
    assert fig.layout.margin.t > viz.figures.MODEBAR_PX + 20
    for axis in (fig.layout.xaxis, fig.layout.yaxis):
        assert axis.type == "log" and axis.dtick == 1 and axis.exponentformat == "SI"


def test_figure_ids_and_summary_ignore_float_noise_but_not_structure():
    """The snapshot's id and the text/plain summary nbval compares depend on structure only."""
    def fig(y, name="share"):
        return go.Figure(go.Bar(x=["a", "b"], y=y, name=name), layout=dict(title="t", yaxis_type="log"))

    stem = lambda f: re.search(r'id="(inferlab-fig-[0-9a-f]{10})-\d+"', viz.figure_html(f)).group(1)  # noqa: E731
    a, b = fig([0.35786879853252973, 0.2]), fig([0.3578686278874295, 0.2])
    assert stem(a) == stem(b) and viz.figure_summary(a) == viz.figure_summary(b)
    renamed = fig([0.35786879853252973, 0.2], name="shares")
    assert stem(renamed) != stem(a) and viz.figure_summary(renamed) != viz.figure_summary(a)
    assert viz.figure_summary(a) == "plotly figure: t\n  yaxis: log\n  bar 'share': 2 points"
    assert viz.show(a)._repr_mimebundle_()["text/plain"] == viz.figure_summary(a)
