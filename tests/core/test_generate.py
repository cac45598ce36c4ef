"""Generation behaviour that needs a tokenizer: stop strings, stop ids, eos, the CLI."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from inferlab import LLM, SamplingParams
from inferlab.cli import main

from .checkpoints import save_with_tokenizer


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    save_with_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def llm(folder):
    return LLM(str(folder), device="cpu")


def greedy(llm, **kw):
    kw.setdefault("max_tokens", 30)
    return llm.generate(["def fib(n):"], SamplingParams(temperature=0, ignore_eos=True, **kw))[0].outputs[0]


def test_max_tokens_and_length_reason(llm):
    out = greedy(llm, max_tokens=7)
    assert len(out.token_ids) == 7 and out.finish_reason == "length"


def test_stop_token_ids_end_the_sequence(llm):
    full = greedy(llm).token_ids
    stop_id = full[5]
    out = greedy(llm, stop_token_ids=[stop_id])
    assert out.token_ids == full[: full.index(stop_id) + 1] and out.finish_reason == "stop"


def test_stop_strings_cut_the_text(llm):
    full = greedy(llm)
    text = full.text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    assert stop, "greedy text too short for this test"
    out = greedy(llm, stop=[stop])
    assert out.finish_reason == "stop"
    assert out.text == text[: text.find(stop)]
    assert len(out.token_ids) < len(full.token_ids)


@pytest.fixture(scope="module")
def eos_model(folder, llm, tmp_path_factory):
    """The same weights, with the end-of-sequence id set to a token the model emits greedily after
    ``def fib(n):`` (its first appearance at position >= 3): a model that emits EOS. The id lives
    in generation_config.json only, as many hub models keep it."""
    import shutil
    full = greedy(llm).token_ids
    k = next(i for i in range(3, len(full)) if full[i] not in full[:i])
    path = tmp_path_factory.mktemp("eos")
    for f in folder.iterdir():
        shutil.copyfile(f, path / f.name)
    cfg = json.loads((path / "config.json").read_text())
    cfg["eos_token_id"] = None
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": full[k]}))
    return path, full, k


def test_eos_stops_the_engine_unless_ignored(eos_model):
    path, full, k = eos_model
    llm = LLM(str(path), device="cpu")
    assert llm.eos_token_ids == (full[k],)
    out = llm.generate(["def fib(n):"], SamplingParams(temperature=0, max_tokens=30))[0].outputs[0]
    assert out.token_ids == full[: k + 1] and out.finish_reason == "stop"
    kept = llm.generate(["def fib(n):"], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    assert kept.outputs[0].token_ids == full and kept.outputs[0].finish_reason == "length"


def test_eos_ends_one_request_in_a_batch_and_not_the_others(eos_model):
    """Two copies of the prompt plus another one, batched: EOS ends exactly the requests that emit it."""
    path, full, k = eos_model
    llm = LLM(str(path), device="cpu")
    sp = [SamplingParams(temperature=0, max_tokens=30), SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
          SamplingParams(temperature=0, max_tokens=30, n=2)]
    outs = llm.generate(["def fib(n):"] * 3, sp)
    assert outs[0].outputs[0].token_ids == full[: k + 1]
    assert outs[1].outputs[0].token_ids == full
    assert [o.token_ids for o in outs[2].outputs] == [full[: k + 1]] * 2


def test_cli_json_names_the_finish_reason(eos_model, capsys):
    path, full, k = eos_model
    assert main(["generate", "def fib(n):", "--model", str(path), "--max-tokens", "30", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["token_ids"] == full[: k + 1] and data["finish_reason"] == "stop"
    assert main(["generate", "def fib(n):", "--model", str(path), "--max-tokens", str(k), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["finish_reason"] == "length"


def test_cli_refuses_max_tokens_beyond_the_context_as_the_server_does(folder, capsys):
    code = main(["generate", "def fib(n):", "--model", str(folder), "--max-tokens", "100000", "--json"])
    err = capsys.readouterr().err
    assert code == 2 and "maximum context length is 128 tokens" in err and err.count("\n") == 1


def test_one_sampling_params_per_prompt_and_seeds(llm):
    prompts = ["def fib(n):", "class A:"]
    sp = [SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True),
          SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)]
    a = llm.generate(prompts, sp)
    b = llm.generate(prompts, sp)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    assert [len(o.outputs[0].token_ids) for o in a] == [12, 5]
    alone = llm.generate(["class A:"], sp[1])[0].outputs[0].token_ids
    assert a[1].outputs[0].token_ids == alone
    with pytest.raises(Exception, match="one per prompt"):
        llm.generate(prompts, sp[:1])


def test_cli_json(folder, capsys):
    assert main(["generate", "def fib(n):", "--model", str(folder), "--max-tokens", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"text", "token_ids", "finish_reason", "prefill_tokens_per_s", "decode_tokens_per_s"}
    assert 1 <= len(data["token_ids"]) <= 8 and data["decode_tokens_per_s"] > 0


def test_cli_streams_text(folder, llm, capsys):
    assert main(["generate", "def fib(n):", "--model", str(folder), "--max-tokens", "10"]) == 0
    printed = capsys.readouterr().out
    expected = llm.generate(["def fib(n):"], SamplingParams(temperature=0, max_tokens=10))[0].outputs[0].text
    assert printed == "def fib(n):" + expected + "\n"


@pytest.mark.parametrize("args", [["generate"], ["generate", "x", "--max-tokens", "zero"],
                                  ["generate", "x", "--top-p", "2"], ["nonsense"],
                                  ["generate", "x", "--model", "/no/such/folder"],
                                  ["generate", "x", "--device", "tpu"], ["generate", "x", "--device=cuda:7"]])
def test_cli_bad_arguments_exit_2(args):
    proc = subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() and "Traceback" not in proc.stderr
    if "--device" in " ".join(args):  # one line, said before any model is loaded
        assert proc.stderr.count("\n") == 1 and "device" in proc.stderr


@pytest.mark.parametrize("args", [["--help"], ["--version"]])
def test_cli_exits_quietly_when_the_reader_closes_the_pipe(args):
    """`inferlab --help | head -0`: no BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(0.5); "
                             "from inferlab.cli import main; sys.exit(main(sys.argv[1:]))", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the command writes
    err = proc.stderr.read().decode()
    assert proc.wait() in (0, 141) and err == "", err


def test_version_and_help_name_every_default():
    from inferlab import __version__
    from inferlab.generate_cli import build_parser
    out = subprocess.run([sys.executable, "-m", "inferlab", "--version"], capture_output=True, text=True).stdout
    assert out == f"inferlab {__version__}\n"
    for action in build_parser()._actions:
        if action.option_strings and action.dest != "help" and action.default is not False:
            assert action.help and "(default:" in action.help, action.option_strings


@pytest.mark.parametrize("command", ["generate", "quantize", "eval ppl", "bench quant", "bench gqa", "models", "train"])
def test_help_describes_every_option_with_its_default_and_no_markup(command, capsys):
    """Every option says what it does, and every option with a default names it; no ``RST``."""
    import argparse
    import contextlib
    parsers = []
    real = argparse.ArgumentParser.parse_args

    def capture(self, *args, **kwargs):
        parsers.append(self)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = capture
    try:
        with contextlib.suppress(SystemExit):
            main([*command.split(), "--help"])
    finally:
        argparse.ArgumentParser.parse_args = real
    (parser,) = parsers
    text = parser.format_help()
    assert "``" not in text and "harnesss" not in text
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        assert action.help, f"{command} {action.option_strings[0]} has no description"
        if action.default not in (None, False):
            assert "default" in parser._get_formatter()._get_help_string(action), action.option_strings


# ---- --quantization (vLLM's flag) on the commands that load one model -----------------------------

def test_cli_quantization_int8_runs_the_quantized_model(capsys):
    from inferlab.quant import QuantLinear

    assert main(["generate", "def fib(n):", "--model", "target", "--device", "cpu", "--max-tokens", "8",
                 "--quantization", "int8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    llm = LLM("target", device="cpu", quantization="int8")
    assert any(isinstance(m, QuantLinear) for m in llm.model.modules())
    want = llm.generate(["def fib(n):"], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0]
    assert data["token_ids"] == want.token_ids


def test_quantization_none_is_no_quantization():
    from inferlab.quant import QuantLinear

    llm = LLM("target", device="cpu", quantization="none")
    assert not any(isinstance(m, QuantLinear) for m in llm.model.modules())
    assert not hasattr(llm, "quantization_config")


@pytest.mark.parametrize("method,shown", [("gptq", True), ("awq", True), ("int8", False)])
def test_a_calibrated_quantization_at_load_shows_its_progress(method, shown, monkeypatch):
    """GPTQ and AWQ fit every layer to calibration data, minutes on smollm2: LLM's load shows a
    bar per layer for them (tqdm: TQDM_DISABLE hides it); the methods that round in a second do not."""
    import inferlab.quant
    from inferlab.llm import load_model

    seen = {}
    monkeypatch.setattr(inferlab.quant, "quantize_model", lambda net, m, **kw: seen.update(kw) or {})
    load_model("target", device="cpu", quantization=method)
    assert seen["progress"] is shown


@pytest.mark.parametrize("command", [["generate", "x"], ["serve"], ["eval", "ppl"], ["bench", "serve"], ["bench", "spec"]])
def test_a_bad_quantization_is_one_line_naming_the_choices(command, capsys):
    assert main([*command, "--quantization", "int9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown quantization 'int9': choose one of none, int8, int4" in err, err


@pytest.mark.parametrize("command,key", [(["eval", "ppl", "--max-tokens", "200"], "ppl"),
                                         (["bench", "serve", "--num-requests", "2", "--max-num-seqs", "2",
                                           "--repeats", "1"], "continuous_tokens_per_s")])
def test_eval_and_bench_run_quantized(command, key, capsys):
    assert main([*command, "--model", "target", "--device", "cpu", "--quantization", "int8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["quantization"] == "int8" and data[key] > 0
