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


def test_eos_stops_unless_ignored(llm):
    eos = llm.eos_token_ids[0]
    full = greedy(llm)
    out = llm.generate(["def fib(n):"], SamplingParams(temperature=0, max_tokens=30,
                                                       stop_token_ids=[], ignore_eos=False))[0].outputs[0]
    if eos in full.token_ids:
        assert out.token_ids == full.token_ids[: full.token_ids.index(eos) + 1]
    else:
        assert out.token_ids == full.token_ids


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
    assert set(data) == {"text", "token_ids", "prefill_tokens_per_s", "decode_tokens_per_s"}
    assert 1 <= len(data["token_ids"]) <= 8 and data["decode_tokens_per_s"] > 0


def test_cli_streams_text(folder, llm, capsys):
    assert main(["generate", "def fib(n):", "--model", str(folder), "--max-tokens", "10"]) == 0
    printed = capsys.readouterr().out
    expected = llm.generate(["def fib(n):"], SamplingParams(temperature=0, max_tokens=10))[0].outputs[0].text
    assert printed == "def fib(n):" + expected + "\n"


@pytest.mark.parametrize("args", [["generate"], ["generate", "x", "--max-tokens", "zero"],
                                  ["generate", "x", "--top-p", "2"], ["nonsense"],
                                  ["generate", "x", "--model", "/no/such/folder"]])
def test_cli_bad_arguments_exit_2(args):
    proc = subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() and "Traceback" not in proc.stderr
