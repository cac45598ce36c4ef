"""The small/large router: its decision, the scores it is priced with (checked against transformers),
and the sweep's accounting."""
import math

import numpy as np
import pytest
import torch

from inferlab.model.loader import ASSETS, load_checkpoint
from inferlab.strategy import router as R


@pytest.fixture(scope="module")
def pair():
    small, tok = load_checkpoint("draft", device="cpu")
    large, _ = load_checkpoint("target", device="cpu")
    return small, large, tok


@pytest.fixture(scope="module")
def code(pair):
    return R.CodeCorpus(pair[2])


@pytest.fixture(scope="module")
def table(pair, code):
    small, large, _ = pair
    return R.score_requests(small, large, R.code_requests(code, 12, prompt_len=24, continuation_len=16))


def test_route_sends_easy_prompts_small():
    assert R.route(2.0, 3.0) == "small" and R.route(3.0, 3.0) == "small" and R.route(3.5, 3.0) == "large"


def test_requests_are_seeded_and_cut_from_the_split(pair, code):
    a = R.code_requests(code, 4, prompt_len=10, continuation_len=5, seed=3)
    assert a == R.code_requests(code, 4, prompt_len=10, continuation_len=5, seed=3)
    assert a == R.code_requests(pair[2], 4, prompt_len=10, continuation_len=5, seed=3)  # a tokenizer: the same cut
    assert a != R.code_requests(code, 4, prompt_len=10, continuation_len=5, seed=4)
    assert all(len(p) == 10 and len(c) == 5 for p, c in a)
    with pytest.raises(ValueError, match="split"):
        R.code_requests(code, 4, split="train")


def test_scores_match_transformers(pair, code, table):
    """The continuation NLL and the prompt NLL, recomputed by transformers' Llama from the same folders."""
    transformers = pytest.importorskip("transformers")
    reqs = R.code_requests(code, 12, prompt_len=24, continuation_len=16)
    x = torch.tensor([p + c for p, c in reqs])
    for name, key in (("target", "large"), ("draft", "small")):
        hf = transformers.LlamaForCausalLM.from_pretrained(ASSETS / name, torch_dtype=torch.float32).eval()
        with torch.no_grad():
            logp = torch.log_softmax(hf(x).logits[:, :-1].float(), -1)
        nll = -logp.gather(-1, x[:, 1:, None])[..., 0]
        np.testing.assert_allclose(table[f"{key}_nll"], nll[:, 23:].mean(1).numpy(), rtol=1e-4)
        np.testing.assert_allclose(table[f"{key}_prompt_nll"], nll[:, :23].mean(1).numpy(), rtol=1e-4)
    assert (table["small_nll"].mean() > table["large_nll"].mean())        # the draft is the weaker model
    assert 0 < table["agreement"].mean() < 1


def test_sweep_accounting(table):
    s = table["score"]
    rows = R.sweep(table, [-np.inf, float(np.median(s)), np.inf], cost_small=1.0, cost_large=4.0, scoring_cost=0.2)
    none, half, every = rows
    assert none["small_share"] == 0 and none["cost"] == pytest.approx(1 + 0.2 / 4)
    assert none["quality"] == 1 and none["agreement"] == 1
    assert every["small_share"] == 1 and every["cost"] == pytest.approx((1 + 0.2) / 4)
    assert every["ppl"] == pytest.approx(math.exp(table["small_nll"].mean()), rel=1e-6)
    assert every["agreement"] == pytest.approx(table["agreement"].mean())
    assert none["cost"] > half["cost"] > every["cost"]
    assert R.best_saving(rows, 0.99) is none and R.best_saving(rows, 0.0) is every
    assert R.best_saving(rows, 2.0) is None


def test_sweep_prices_a_mix_worked_by_hand():
    """Four requests whose numbers are chosen so the mix can be worked out on paper. At threshold
    2.0 the two easiest go small: a score equal to the threshold is easy (the router's <=)."""
    table = {"score": np.array([1.0, 2.0, 3.0, 4.0]),
             "small_nll": np.array([1.0, 2.0, 9.0, 9.0]), "large_nll": np.array([5.0, 5.0, 0.5, 1.5]),
             "agreement": np.array([0.5, 0.25, 0.0, 0.0])}
    (row,) = R.sweep(table, [2.0], cost_small=1.0, cost_large=4.0, scoring_cost=0.5)
    assert row["small_share"] == 0.5
    assert row["cost"] == pytest.approx((2 * 1 + 2 * 4 + 4 * 0.5) / (4 * 4))   # 12 / 16
    assert row["ppl"] == pytest.approx(math.exp(1.25))                       # mean of 1, 2, 0.5, 1.5
    assert row["quality"] == pytest.approx(math.exp(3.0) / math.exp(1.25))   # large alone: mean nll 3
    assert row["agreement"] == pytest.approx((0.5 + 0.25 + 1 + 1) / 4)       # the large model agrees with itself


def test_shared_prefix_scores_match_transformers(pair, code):
    """Chat requests share their system prompt: ``score_requests`` runs it once and copies its K/V to
    every row. Requests of different lengths with a 20-token common prefix and a signal that starts
    past it must score as transformers scores each request alone."""
    transformers = pytest.importorskip("transformers")
    small, large, _ = pair
    cuts = R.code_requests(code, 5, prompt_len=30, continuation_len=12, seed=7)
    prefix = cuts[0][0][:20]
    reqs = [(prefix + p[:10 + k], c[:12 - k], 20 + k) for k, (p, c) in enumerate(cuts)]
    assert R._shared_prefix(reqs) == 19   # the logit that scores token 20 comes from token 19: computed per row
    table = R.score_requests(small, large, reqs, batch_size=2)
    for name, key in (("target", "large"), ("draft", "small")):
        hf = transformers.LlamaForCausalLM.from_pretrained(ASSETS / name, torch_dtype=torch.float32).eval()
        for i, (p, c, start) in enumerate(reqs):
            x = torch.tensor([p + c])
            with torch.no_grad():
                logp = torch.log_softmax(hf(x).logits[0, :-1].float(), -1)
            nll = -logp.gather(-1, x[0, 1:, None])[:, 0]
            assert table[f"{key}_nll"][i] == pytest.approx(float(nll[len(p) - 1:].mean()), rel=1e-4)
            assert table[f"{key}_prompt_nll"][i] == pytest.approx(float(nll[start - 1:len(p) - 1].mean()), rel=1e-4)
