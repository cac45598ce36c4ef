"""``bench quant``'s speed pass: every weight format timed in one interleaved pass at the end, reported
as tok/s and as a ratio to fp32 from that same pass; rows take their format's speed.

The engine is replaced by runners that advance a fake clock by a known cost per token, so the
arithmetic and the order of the runs are checked exactly, in milliseconds, without timing anything.
"""
from types import SimpleNamespace

import pytest
import torch

from inferlab.bench import quant, quant_speed, stats
from inferlab.quant.base import QuantizationError

COST = {"fp32": 0.04, "fp16": 0.025, "int8": 0.02, "int4": 0.01, "nf4": 0.05}  # seconds per decoded token
SCALE = {"random-80m": 1.0, "target": 0.25}  # the small model is faster in every format


@pytest.fixture
def fake_engine(monkeypatch):
    """Variants that cost COST[format] x SCALE[model] seconds per token on a fake clock; q4_k is skipped
    (as on a model its 256-value blocks do not divide); every call is logged as (model, format, n)."""
    clock, log = [0.0], []

    def variant(model, fmt):
        if fmt == "q4_k":
            raise QuantizationError("q4_k blocks hold 256 values, which does not divide 96")
        return SimpleNamespace(key=(model, fmt), model=torch.nn.Linear(8, 8), encode=lambda text: [1, 2, 3])

    def engine_run(llm, ids):
        model, fmt = llm.key

        def run(n):
            log.append((model, fmt, n))
            clock[0] += SCALE[model] * (0.3 + n * COST[fmt])  # a prefill, then n tokens
        return run

    monkeypatch.setattr(quant_speed, "_variant", variant)
    monkeypatch.setattr(quant_speed, "engine_run", engine_run)
    monkeypatch.setattr(quant_speed, "GGUF", {})  # no llama.cpp child processes here
    monkeypatch.setattr(stats, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    return log


def test_speed_pass_interleaves_every_format_and_reports_ratios_to_fp32(fake_engine):
    formats = ["fp32", "int8", "int4", "q4_k"]
    res = quant_speed.speed_pass(["random-80m", "target"], formats, new_tokens=9, repeats=3)
    variants = [(m, f) for m in ("random-80m", "target") for f in ("fp32", "int8", "int4")]
    # one warm-up each, then 3 rounds; every round visits every variant (n = 9 and n = 1) before the next
    assert [(m, f) for m, f, _ in fake_engine[:len(variants)]] == variants
    rounds = fake_engine[len(variants):]
    per_round = 2 * len(variants)
    assert len(rounds) == 3 * per_round
    for k in range(3):
        assert sorted(rounds[k * per_round:(k + 1) * per_round]) == sorted(
            (m, f, n) for m, f in variants for n in (9, 1)), f"round {k} does not visit every variant once"
    fast = res["random-80m"]
    assert fast["fp32"]["tokens_per_s"] == 25.0 and fast["int8"]["tokens_per_s"] == 50.0  # 1 / cost: prefill excluded
    assert [fast[f]["vs_fp32"] for f in ("fp32", "int8", "int4")] == [1.0, 2.0, 4.0]
    assert res["target"]["int4"]["tokens_per_s"] == 400.0 and res["target"]["int4"]["vs_fp32"] == 4.0
    assert "256" in fast["q4_k"]["skipped"] and list(fast) == formats  # a skipped format says why, in place
    assert fast["fp32"]["weight_mb"] == round(8 * 9 * 4 / 2**20, 1)


def fake_row(model_name, name, bits, group, max_tokens, calib_samples, progress=False):
    ppl = {"fp32": 10.0, "fp16": 10.0, "int8": 10.01, "int4": 10.5 if bits == 4 else 11.0,
           "gptq": 10.2 if bits == 4 else 10.6, "nf4": 10.4}[name]
    return {"name": quant.row_name(name, bits), "method": name, "bits": bits, "ppl": ppl, "ppl_tokens": 64,
            "bytes_ratio_vs_fp16": 0.26 if bits < 8 else 0.5, "ppl_protocol": {"split": "test", "tokens": 64, "window": 512, "stride": 256},
            "other_bytes": 1000, "bits_per_weight": 4.2, "weight_bytes": 2000,
            "format": quant_speed.format_of(name)}


def test_rows_take_their_formats_speed_from_one_pass_after_every_row(fake_engine, monkeypatch):
    scored = []
    monkeypatch.setattr(quant, "_row", lambda *a, **k: scored.append(len(fake_engine)) or fake_row(*a, **k))
    res = quant.run("target", only=["int8", "int4", "gptq", "nf4"], new_tokens=5, repeats=2, progress=False)
    assert scored and max(scored) == 0, "every row is scored before the speed pass starts"
    assert res["speed"]["model"] == "random-80m" and res["speed"]["random_weights"] is True
    timed = {(m, f) for m, f, _ in fake_engine}
    assert timed == {(m, f) for m in ("random-80m", "target") for f in ("fp32", "fp16", "int8", "int4", "nf4")}
    rows = {r["name"]: r for r in res["rows"]}
    assert rows["gptq-w4"]["format"] == rows["gptq-w3"]["format"] == rows["int4-w3"]["format"] == "int4"
    for name in ("gptq-w4", "gptq-w3", "int4-w3"):  # GPTQ and 3-bit load as int4 codes: int4's kernel
        assert rows[name]["speed_tokens_per_s"] == rows["int4-w4"]["speed_tokens_per_s"] == 100.0
    assert rows["int8"]["speed_vs_fp32"] == 2.0 and rows["nf4"]["speed_vs_fp32"] == 0.8
    assert rows["int8"]["decode_tokens_per_s"] == 200.0 and rows["int8"]["decode_vs_fp32"] == 2.0
    g = res["goals"]
    assert g["int8_speed_vs_fp32"] == {"value": 2.0, "target": "> 1", "met": True}
    assert g["int4_speed_vs_fp32"]["value"] == 4.0 and g["int4_speed_vs_fp32"]["met"] is True
    assert "speed_vs_fp32" in res["fields"] and "random-80m tok/s" in quant.table(res)


def test_a_format_slower_than_fp32_is_a_missed_goal_that_says_why(fake_engine, monkeypatch):
    monkeypatch.setitem(COST, "int8", 0.05)
    monkeypatch.setattr(quant, "_row", fake_row)
    res = quant.run("target", only=["int8"], new_tokens=5, repeats=1, progress=False)
    g = res["goals"]["int8_speed_vs_fp32"]
    assert g["met"] is False and g["value"] == 0.8 and "0.8x fp32 on random-80m" in g["why"]
    assert "missed: int8 decodes at 0.8x" in quant.table(res)
