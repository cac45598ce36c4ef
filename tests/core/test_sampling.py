"""Sampling honours temperature, top-k, top-p and seeds (statistical checks with fixed seeds)."""
from __future__ import annotations

import pytest
import torch

from inferlab.sampling import SamplingParams, filter_logits, make_generator, probs_from_logits, sample

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])


def draw(params: SamplingParams, n: int = 4000, logits=LOGITS) -> torch.Tensor:
    g = make_generator(params.seed, "cpu")
    batch = logits.expand(n, -1).clone()
    return sample(batch, [params] * n, [g] * n)


def test_greedy_is_argmax():
    assert draw(SamplingParams(temperature=0), n=10).tolist() == [0] * 10


def test_top_k_only_draws_the_k_most_likely():
    tokens = draw(SamplingParams(temperature=1.0, top_k=3, seed=0))
    assert set(tokens.tolist()) == {0, 1, 2}


def test_top_p_keeps_the_smallest_nucleus():
    probs = LOGITS.softmax(-1)
    # p=0.85: cumulative 0.40, 0.65, 0.80, 0.89 -> the nucleus is the first four tokens
    assert probs[:3].sum() < 0.85 <= probs[:4].sum()
    tokens = draw(SamplingParams(temperature=1.0, top_p=0.85, seed=0))
    assert set(tokens.tolist()) == {0, 1, 2, 3}


def test_frequencies_follow_the_filtered_distribution():
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.95, seed=123)
    n = 20000
    counts = torch.bincount(draw(params, n=n), minlength=len(LOGITS)).float()
    expected = filter_logits(LOGITS, 0.8, 5, 0.95).softmax(-1) * n
    kept = expected > 0
    assert (counts[~kept] == 0).all()
    chi2 = ((counts[kept] - expected[kept]) ** 2 / expected[kept]).sum().item()
    assert chi2 < 20.5  # 99.9th percentile of chi-square with 4 degrees of freedom (18.5) plus slack


def test_temperature_sharpens_and_flattens():
    cold = torch.bincount(draw(SamplingParams(temperature=0.3, seed=1)), minlength=8)[0]
    hot = torch.bincount(draw(SamplingParams(temperature=3.0, seed=1)), minlength=8)[0]
    assert cold > 2 * hot


def test_same_seed_same_tokens_other_seed_other_tokens():
    a = draw(SamplingParams(seed=7), n=200)
    b = draw(SamplingParams(seed=7), n=200)
    c = draw(SamplingParams(seed=8), n=200)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_probs_from_logits_is_one_hot_when_greedy():
    p = probs_from_logits(LOGITS, SamplingParams(temperature=0))
    assert p.tolist() == [1.0] + [0.0] * 7


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5),
                                    dict(top_k=-2), dict(max_tokens=0)])
def test_bad_sampling_params_are_refused(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
