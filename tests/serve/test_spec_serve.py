"""``inferlab serve --speculative-config``: a server speculating with Medusa heads answers the
official openai client with plain decoding's tokens, and /metrics carries vLLM's spec-decode
counters, equal to the engine's own."""
from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferlab.cli import main
from inferlab.serve.launcher import ServerThread, make_app

SPEC = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


def spec_counters(url: str) -> dict:
    r = httpx.get(url + "/metrics")
    assert r.status_code == 200
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            if fam.name in SPEC:
                assert s.name == fam.name + "_total"  # a Prometheus counter, as vLLM exposes it
                out[fam.name] = s.value
    return out


def test_medusa_server_answers_like_plain_decoding_and_counts(tmp_path):
    from openai import OpenAI

    from inferlab.llm import LLM
    from inferlab.sampling import SamplingParams

    prompts = ["def fib(n):\n", "import os\n\n\nclass Path:\n    def __init__(self, path):\n"]
    plain = LLM("target", device="cpu").generate(prompts, SamplingParams(temperature=0, max_tokens=24))
    app = make_app("target", device="cpu", max_num_seqs=4, num_kv_blocks=64,
                   speculative_config={"method": "medusa", "num_speculative_tokens": 3})
    with ServerThread(app) as server:
        assert spec_counters(server.url) == dict.fromkeys(SPEC, 0.0)
        client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        for prompt, want in zip(prompts, plain):
            r = client.completions.create(model="target", prompt=prompt, max_tokens=24, temperature=0)
            assert r.choices[0].text == want.outputs[0].text
        got = spec_counters(server.url)
        engine = server.app.state.engine.call(lambda e: dict(e.counters)).result(30)
    assert got == {name: float(engine[name.removeprefix("vllm:")]) for name in SPEC}
    assert 0 < got["vllm:spec_decode_num_accepted_tokens"] < got["vllm:spec_decode_num_draft_tokens"]
    assert got["vllm:spec_decode_num_draft_tokens"] <= 3 * got["vllm:spec_decode_num_drafts"]


@pytest.mark.parametrize("config, words", [
    ("{method: medusa}", "--speculative-config is not valid JSON"),
    ('{"method": "lookahead", "num_speculative_tokens": 2}', "unknown speculative method"),
    ('{"method": "medusa", "num_speculative_tokens": 0}', "num_speculative_tokens must be"),
    ('{"method": "ngram", "num_speculative_tokens": 99}', "num_speculative_tokens must be"),
])
def test_bad_speculative_config_is_a_one_line_usage_error(capsys, config, words):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--speculative-config", config])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and words in err.splitlines()[-1] and "Traceback" not in err


def test_medusa_on_a_model_without_heads_says_what_to_run(capsys):
    assert main(["serve", "--model", "draft", "--device", "cpu", "--speculative-config",
                 '{"method": "medusa", "num_speculative_tokens": 2}']) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no Medusa heads" in err and "inferlab train medusa" in err
