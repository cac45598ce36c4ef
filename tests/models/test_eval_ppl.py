"""The perplexity harness: sliding windows score each token once, and the CLI prints its JSON."""
import math

import pytest
import torch
import torch.nn.functional as F

from inferlab.model.config import ModelConfig
from inferlab.eval.ppl import evaluate, windows
from inferlab.model import CausalLM

from .conftest import run_json


@pytest.mark.parametrize("n,window,stride", [(10, 4, 2), (1000, 128, 64), (513, 512, 256), (50, 64, 64), (7, 3, 3)])
def test_windows_score_every_token_once(n, window, stride):
    scored = []
    for begin, end, first in windows(n, window, stride):
        assert end - begin <= window and begin < first <= end
        scored += range(first, end)
    assert scored == list(range(1, n))


def _tiny_model():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    return CausalLM(cfg).eval()


def test_one_window_equals_plain_cross_entropy():
    model, ids = _tiny_model(), torch.randint(0, 50, (40,))
    res = evaluate(model, ids, window=64)
    with torch.no_grad():
        expected = F.cross_entropy(model(ids[None])[0, :-1], ids[1:]).item()
    assert res["tokens"] == 39 and math.isclose(res["nll_per_token"], expected, rel_tol=1e-5)
    assert math.isclose(res["ppl"], math.exp(expected), rel_tol=1e-5)


def test_sliding_window_and_agreement():
    model, ids = _tiny_model(), torch.randint(0, 50, (300,))
    res = evaluate(model, ids, window=32, stride=8, batch_size=3, reference=model)
    assert res["tokens"] == 299 and res["agreement"] == 1.0
    assert evaluate(model, ids, window=32, stride=8, max_tokens=100)["tokens"] == 100


def test_cli_ppl_json(capsys, shipped):
    name, _ = shipped
    out = run_json(capsys, "eval", "ppl", "--model", name, "--max-tokens", "600", "--json")
    assert set(out) == {"model", "ppl", "nll_per_token", "tokens", "ppl_protocol"}
    assert out["model"] == name and out["tokens"] == 600
    assert out["ppl_protocol"] == {"split": "test", "tokens": 600, "window": 512, "stride": 256, "whole_split": False}
    assert 1 < out["ppl"] < 100 and math.isclose(math.log(out["ppl"]), out["nll_per_token"], rel_tol=1e-3)


def test_cli_rejects_bad_input(capsys):
    from inferlab import cli

    assert cli.main(["eval", "ppl", "--model", "/no/such/folder", "--json"]) == 2
    assert "not found" in capsys.readouterr().err
    assert cli.main(["eval", "nope"]) == 2


def test_every_command_that_prints_a_perplexity_uses_one_protocol():
    """eval ppl, bench quant and bench gqa default to the whole test split with evaluate()'s window and
    stride, as `inferlab train` measured the figures `inferlab models` shows; each names the protocol."""
    import argparse
    import inspect

    from inferlab.bench import gqa, quant
    from inferlab.embedded import list_models
    from inferlab.eval import ppl

    defaults = ppl.build_parser().parse_args([])
    assert (defaults.split, defaults.max_tokens, defaults.window, defaults.stride) == ("test", None, None, None)
    assert inspect.signature(quant.run).parameters["max_tokens"].default is None
    assert inspect.signature(gqa.run).parameters["eval_tokens"].default is None
    for mod in (quant, gqa):
        src = inspect.getsource(mod.main)
        assert "default=None" in src.split("--max-tokens" if mod is quant else "--eval-tokens")[1].split(")")[0]
    for m in list_models():
        if m["test_ppl"] is not None:
            assert m["ppl_protocol"] == {"split": "test", "tokens": 101104, "window": 512, "stride": 256,
                                         "whole_split": True}, m["name"]
    assert ppl.describe({"split": "test", "tokens": 101104, "window": 512, "stride": 256, "whole_split": True}) \
        == "test split, all 101,104 tokens, window 512, stride 256"


@pytest.mark.slow
def test_models_and_eval_ppl_print_the_same_perplexity(capsys):
    """The draft (the smallest shipped model): `inferlab models` and `inferlab eval ppl` agree."""
    listed = {m["name"]: m for m in run_json(capsys, "models", "--json")}["draft"]
    measured = run_json(capsys, "eval", "ppl", "--model", "draft", "--json")
    assert measured["ppl_protocol"] == listed["ppl_protocol"]
    assert abs(measured["ppl"] - listed["test_ppl"]) < 0.01
