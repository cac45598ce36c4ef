"""``inferlab generate`` and ``inferlab serve`` pass ``--tensor-parallel-size`` through: the same
greedy tokens as TP=1, and the server answers the official OpenAI client from two ranks."""
from __future__ import annotations

import gc
import json

import pytest

from inferlab import LLM
from inferlab.sampling import SamplingParams

from .test_tp_lifecycle import alive

PROMPT = "def parse(text):"


@pytest.fixture(scope="module")
def reference():
    out = LLM("mqa", device="cpu", dtype="float32", max_num_seqs=1).generate(
        [PROMPT], SamplingParams(max_tokens=12, temperature=0))[0].outputs[0]
    return out.token_ids, out.text


def test_generate_cli(reference, capsys):
    from inferlab.generate_cli import main
    assert main([PROMPT, "--model", "mqa", "--device", "cpu", "--max-tokens", "12", "--json",
                 "--tensor-parallel-size", "2"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["token_ids"] == reference[0]
    gc.collect()  # the CLI's LLM is gone: its ranks stop


def test_server(reference):
    pytest.importorskip("fastapi")
    openai = pytest.importorskip("openai")
    from inferlab.serve import parser
    from inferlab.serve.launcher import ServerThread, make_app

    args = parser().parse_args(["--model", "mqa", "--tensor-parallel-size", "2", "--device", "cpu"])
    app = make_app(args.model, device=args.device, dtype="float32", max_num_seqs=4, num_kv_blocks=32,
                   tensor_parallel_size=args.tensor_parallel_size)
    executor = app.state.engine.engine.runner.executor  # rank 0 drives a worker
    assert len(executor.pids) == 1
    with ServerThread(app) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        out = client.completions.create(model="mqa", prompt=PROMPT, max_tokens=12, temperature=0)
        assert out.choices[0].text == reference[1]
    pids = executor.pids
    executor.shutdown()  # what the process's exit does (test_tp_lifecycle)
    assert not any(alive(p) for p in pids)
