"""``inferlab quantize`` writes folders that the loader, ``LLM`` and ``inferlab eval ppl`` read back;
bad arguments are one-line errors; a failed run leaves nothing; ``bench quant`` reports its rows."""
import json

import pytest
import torch

from inferlab import cli
from inferlab.llm import LLM
from inferlab.quant import GGMLLinear, NF4Linear

from .helpers import tiny_model  # noqa: F401  (keeps the package import order stable)


def run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("method,cls", [("nf4", NF4Linear), ("q4_k", GGMLLinear)])
def test_quantize_then_generate_and_eval(tmp_path, capsys, method, cls):
    out = tmp_path / f"target-{method}"
    code, stdout, err = run(capsys, "quantize", "--model", "target", "--method", method, "--out", str(out), "--json")
    assert code == 0, err
    res = json.loads(stdout)
    assert res["quantization_config"]["quant_method"] == method and res["bits_per_weight"] == 4.5
    llm = LLM(model=str(out))
    assert isinstance(llm.model.model.layers[0].mlp.up_proj, cls)
    code, stdout, err = run(capsys, "generate", "def fib(n):", "--model", str(out), "--max-tokens", "4", "--json")
    assert code == 0, err
    assert len(json.loads(stdout)["token_ids"]) == 4
    code, stdout, err = run(capsys, "eval", "ppl", "--model", str(out), "--max-tokens", "512", "--json")
    assert code == 0, err
    ppl = json.loads(stdout)["ppl"]
    code, stdout, _ = run(capsys, "eval", "ppl", "--model", "target", "--max-tokens", "512", "--json")
    assert 1 < ppl < 1.2 * json.loads(stdout)["ppl"]


@pytest.mark.parametrize("argv,message", [
    (["--method", "fp3"], "unknown quantization method 'fp3'"),
    (["--method", "int4", "--bits", "5"], "int4 supports --bits 2 or 3 or 4, not 5"),
    (["--method", "int4", "--group-size", "100"], "group size 100 does not divide the input dimension 256"),
    (["--method", "gptq", "--format", "gguf"], "--format gguf writes llama.cpp blocks"),
])
def test_bad_arguments_are_one_line_errors_and_write_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    code, _, err = run(capsys, "quantize", "--model", "target", "--out", str(out), *argv)
    assert code == 2 and message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_a_failed_quantize_leaves_no_partial_folder(tmp_path, monkeypatch):
    from inferlab.quant import checkpoint

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "save_file", boom)
    with pytest.raises(OSError):
        cli.main(["quantize", "--model", "target", "--method", "int8", "--out", str(tmp_path / "q")])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_bench_quant_smoke(capsys):
    code, stdout, err = run(capsys, "bench", "quant", "--methods", "int8,q4_0,int4", "--max-tokens", "256",
                            "--calib-samples", "1", "--new-tokens", "4", "--repeats", "1", "--speed-model", "draft",
                            "--json")
    assert code == 0, err
    res = json.loads(stdout)
    rows = {r["name"]: r for r in res["rows"]}
    assert list(rows) == ["fp32", "fp16", "int8", "int4-w4", "q4_0", "int4-w3"]
    assert [(r["method"], r["bits"]) for r in res["rows"]][-1] == ("int4", 3)
    for r in rows.values():
        assert {"method", "bits_per_weight", "weight_bytes", "bytes_ratio_vs_fp16", "ppl", "ppl_delta_pct",
                "format", "speed_tokens_per_s", "speed_vs_fp32", "decode_tokens_per_s", "decode_vs_fp32"} <= set(r)
        assert r["other_bytes"] == rows["fp32"]["other_bytes"] > 0  # embeddings etc., the same in every row
    assert rows["fp16"]["bytes_ratio_vs_fp16"] == 1 and rows["q4_0"]["bits_per_weight"] == 4.5
    assert rows["int8"]["weight_bytes"] < 0.51 * rows["fp16"]["weight_bytes"]
    assert res["ppl_protocol"] == {"split": "test", "tokens": 256, "window": 512, "stride": 256, "whole_split": False}
    assert set(res["fields"]) >= {"bytes_ratio_vs_fp16", "ppl_delta_pct"}
    g = res["goals"]["int8_ppl_delta_pct"]
    assert g["met"] == (abs(rows["int8"]["ppl_delta_pct"]) <= 0.5) and g["value"] == rows["int8"]["ppl_delta_pct"]


def rows_for_goals(int8_ppl, int4_ppl, gptq_ppl, awq_ppl, int4_ratio=0.26):
    def row(method, bits, ppl, ratio=0.5):
        return {"method": method, "bits": bits, "ppl": ppl, "ppl_delta_pct": round(100 * (ppl / 10 - 1), 3),
                "bytes_ratio_vs_fp16": ratio}
    return [row("fp16", 16, 10.0, 1.0), row("int8", 8, int8_ppl), row("int4", 4, int4_ppl, int4_ratio),
            row("gptq", 4, gptq_ppl), row("awq", 4, awq_ppl)]


def test_goals_are_met_or_missed_by_their_numbers_and_a_miss_says_why():
    from inferlab.bench.quant import goals
    ok = goals(rows_for_goals(10.04, 12.0, 10.5, 11.0))
    assert [g["met"] for g in ok.values()] == [True, True, True, True] and not any("why" in g for g in ok.values())
    assert ok["gptq_w4_gap_closed"]["value"] == 0.75 and ok["awq_w4_gap_closed"]["value"] == 0.5
    bad = goals(rows_for_goals(10.06, 12.0, 11.5, 11.3, int4_ratio=0.31))
    assert {k for k, g in bad.items() if g["met"] is False} == {"int8_ppl_delta_pct", "gptq_w4_gap_closed",
                                                                 "awq_w4_gap_closed", "int4_bytes_ratio_vs_fp16"}
    assert bad["awq_w4_gap_closed"]["value"] == 0.35 and "0.35" in bad["awq_w4_gap_closed"]["why"]
    assert all("target" in g["why"] for g in bad.values())


def test_q4_k_on_a_narrow_model_falls_back_to_q4_1_per_tensor_and_says_so(tmp_path, capsys):
    """The draft's widths (128, 384) are not multiples of Q4_K's 256: as llama.cpp does, each such
    tensor takes a 32-value type instead, recorded per tensor and counted in the summary."""
    code, out, _ = run(capsys, "quantize", "--model", "draft", "--method", "q4_k", "--out", str(tmp_path / "q"))
    qcfg = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    n = len(qcfg["modules"])
    assert code == 0 and n > 0 and set(map(str, qcfg["modules"].values())) == {"{'quant_method': 'q4_1'}"}
    assert f"{n} tensors as q4_1 (the q4_k block does not divide their width)" in out


def test_bench_quant_rows_on_the_draft_name_their_bits_and_count_other_bytes_once():
    """The small model, few tokens: rows named with their bits, other_bytes the same positive number in
    every row (it was negative once: counted after quantizing, when codes are buffers, not parameters)."""
    from inferlab.bench.quant import run
    res = run("draft", max_tokens=64, only=["int4"], new_tokens=2, repeats=1, progress=False, speed_model="draft")
    rows = res["rows"]
    assert [r["name"] for r in rows] == ["fp32", "fp16", "int4-w4", "int4-w3"]
    assert list(res["speed"]["formats"]) == ["draft"] and list(res["speed"]["formats"]["draft"]) == ["fp32", "fp16", "int4"]
    assert rows[0]["speed_vs_fp32"] == 1.0 and rows[2]["speed_tokens_per_s"] == rows[3]["speed_tokens_per_s"] > 0
    assert len({r["other_bytes"] for r in rows}) == 1 and rows[0]["other_bytes"] > 0
    assert rows[0]["ppl_protocol"]["tokens"] == 64 and not rows[0]["ppl_protocol"]["whole_split"]
    assert rows[2]["bits_per_weight"] < rows[1]["bits_per_weight"] / 3
