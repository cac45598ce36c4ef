"""Sampling honours temperature, top-k, top-p and seeds (statistical checks with fixed seeds).

The expected distributions come from computations nobody here wrote (transformers' logits warpers,
applied in generate's order: temperature, then top-k, then top-p) or from plain numpy written for
these tests, never from the sampler's own helpers."""
from __future__ import annotations

import pytest
import torch

import numpy as np

from inferlab.sampling import SamplingParams, make_generator, probs_from_logits, sample

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


def numpy_probs(logits, temperature, top_k, top_p):
    """Temperature, then top-k, then top-p, in plain numpy (float64)."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    keep = np.ones(len(z), bool)
    if 0 < top_k < len(z):
        keep &= z >= np.sort(z)[::-1][top_k - 1]
    p = np.where(keep, np.exp(z - z[keep].max()), 0.0)
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    before = np.cumsum(p[order]) - p[order]  # mass of the more likely tokens
    nucleus = np.zeros(len(z), bool)
    nucleus[order[before < top_p]] = True
    p = np.where(nucleus, p, 0.0)
    return p / p.sum()


def hf_probs(logits, temperature, top_k, top_p):
    """transformers' own warpers, in the order generate() applies them."""
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)
    scores = logits.double()[None].clone()
    warpers = [TemperatureLogitsWarper(temperature)]
    if top_k > 0:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1:
        warpers.append(TopPLogitsWarper(top_p))
    for w in warpers:
        scores = w(None, scores)
    return scores.softmax(-1)[0]


@pytest.mark.parametrize("temperature", [0.5, 0.8, 1.0, 2.0])
def test_top_p_keeps_the_smallest_nucleus_at_every_temperature(temperature):
    """The nucleus is taken from the tempered distribution: at T=0.5 it is smaller than at T=1."""
    p = numpy_probs(LOGITS.numpy(), temperature, -1, 0.85)
    nucleus = set(np.flatnonzero(p).tolist())
    # cumulative at T=1: 0.40, 0.65, 0.80, 0.89 (four tokens); at T=0.5: 0.63, 0.87 (two)
    assert nucleus == {1.0: {0, 1, 2, 3}, 0.5: {0, 1}}.get(temperature, nucleus)
    tokens = draw(SamplingParams(temperature=temperature, top_p=0.85, seed=0))
    assert set(tokens.tolist()) == nucleus


CASES = [(t, k, p) for t in (0.3, 0.7, 1.0, 1.8) for k, p in ((-1, 0.6), (5, 1.0), (20, 0.9), (3, 0.5), (50, 0.75))]


@pytest.mark.parametrize("temperature,top_k,top_p", CASES)
def test_distribution_matches_transformers_and_numpy(temperature, top_k, top_p):
    """Applying temperature after the filters (a plausible slip) changes the nucleus and fails here."""
    logits = torch.randn(64, generator=torch.Generator().manual_seed(int(100 * temperature) + top_k)) * 2.5
    ours = probs_from_logits(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    ref = hf_probs(logits, temperature, top_k, top_p)
    torch.testing.assert_close(ours.double(), ref, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ours.double().numpy(), numpy_probs(logits.numpy(), temperature, top_k, top_p),
                               rtol=1e-4, atol=1e-6)


def test_frequencies_follow_the_filtered_distribution():
    params = SamplingParams(temperature=0.5, top_k=6, top_p=0.9, seed=123)
    n = 20000
    counts = torch.bincount(draw(params, n=n), minlength=len(LOGITS)).float()
    expected = torch.from_numpy(numpy_probs(LOGITS.numpy(), 0.5, 6, 0.9)).float() * n
    kept = expected > 0
    assert kept.sum() == 3  # the tempered nucleus; at T=1 it would hold 5 tokens
    assert (counts[~kept] == 0).all()
    chi2 = ((counts[kept] - expected[kept]) ** 2 / expected[kept]).sum().item()
    assert chi2 < 16.0  # 99.9th percentile of chi-square with 2 degrees of freedom (13.8) plus slack


def test_rows_with_different_params_in_one_batch():
    """One call, mixed rows: greedy, top-k at a low temperature, top-p at a high one."""
    n = 3000
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.4, top_k=2, seed=1),
              SamplingParams(temperature=2.0, top_p=0.5, seed=2)] * n
    gens = [make_generator(p.seed, "cpu") for p in params[:3]] * n
    tokens = sample(LOGITS.expand(3 * n, -1).clone(), params, gens).view(n, 3)
    assert (tokens[:, 0] == 0).all()
    for col, (t, k, p) in ((1, (0.4, 2, 1.0)), (2, (2.0, -1, 0.5))):
        expected = numpy_probs(LOGITS.numpy(), t, k, p)
        freq = torch.bincount(tokens[:, col], minlength=len(LOGITS)).double().numpy() / n
        assert set(np.flatnonzero(freq)) == set(np.flatnonzero(expected))
        assert np.abs(freq - expected).max() < 0.04


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
