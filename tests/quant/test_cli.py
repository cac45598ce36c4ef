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
    code, stdout, err = run(capsys, "bench", "quant", "--methods", "int8,q4_0", "--max-tokens", "256",
                            "--calib-samples", "1", "--new-tokens", "4", "--repeats", "1", "--json")
    assert code == 0, err
    res = json.loads(stdout)
    rows = {r["method"]: r for r in res["rows"]}
    assert list(rows) == ["fp32", "fp16", "int8", "q4_0"]
    for r in rows.values():
        assert {"method", "bits_per_weight", "weight_bytes", "bytes_ratio_vs_fp16", "ppl", "ppl_delta_pct",
                "decode_tokens_per_s"} <= set(r)
    assert rows["fp16"]["bytes_ratio_vs_fp16"] == 1 and rows["q4_0"]["bits_per_weight"] == 4.5
    assert rows["int8"]["weight_bytes"] < 0.51 * rows["fp16"]["weight_bytes"]
    assert res["goals"]["int8_ppl_delta_pct"]["met"] in (True, False)
