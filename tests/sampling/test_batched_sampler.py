"""The batched sampler against the one-row reference ``probs_from_logits``.

``sample`` draws for a whole batch in one pass (per-row tensors, candidates from one topk,
inverse-transform draws, top-p by rejection); each row must still follow its own request's
distribution, and a seeded row must not depend on what else shares its batch."""
import pytest
import torch

from inferlab.sampling import SamplingParams, draw, draw_top_p, make_generator, probs_from_logits, sample, top_k_probs
from tests.engine.test_spec_distribution import assert_chi_square

MIX = [SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=1.3, top_p=0.8),
       SamplingParams(temperature=0.5, top_k=10, top_p=0.5), SamplingParams(temperature=1.0, top_p=0.9),
       SamplingParams(temperature=2.0, top_k=40, top_p=0.99), SamplingParams(temperature=1.0, top_k=1)]
TOP_K = [p for p in MIX if p.top_k > 0]
TOP_P = [p for p in MIX if p.top_k <= 0]


def _scaled(logits, params):
    return logits / torch.tensor([p.temperature for p in params])[:, None]


@pytest.mark.parametrize("ties", [False, True], ids=["candidates", "ties-force-full-sort"])
def test_top_k_rows_follow_the_reference(ties):
    torch.manual_seed(0)
    logits = torch.randn(len(TOP_K), 600) * 4
    if ties:
        logits[0, :60] = 30.0  # top-k 5 inside a tie of 60 values, past the 41 candidates: all 60 stay
    probs, idx = top_k_probs(_scaled(logits, TOP_K), TOP_K)
    assert idx.shape[1] == (600 if ties else 41)  # 40 (largest top-k) + 1 to see a tie at the edge
    full = torch.zeros_like(logits).scatter_(1, idx, probs)
    for i, p in enumerate(TOP_K):
        torch.testing.assert_close(full[i] / full[i].sum(), probs_from_logits(logits[i], p), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("scale", [0.01, 0.3, 4.0, 30.0], ids=["near-flat", "wide", "peaked", "one-token"])
def test_top_p_draws_follow_the_sorted_nucleus(scale):
    """Rejection top-p against the sort-based reference: never a token outside the nucleus, and
    frequencies that pass a chi-square test (accepting the first draw always fails it)."""
    torch.manual_seed(1)
    logits = torch.randn(len(TOP_P), 60) * scale
    n = 6000
    probs = _scaled(logits, TOP_P).softmax(-1)
    tokens = draw_top_p(probs.repeat(n, 1), torch.tensor([p.top_p for p in TOP_P]).repeat(n)[:, None],
                        [None] * (n * len(TOP_P))).view(n, len(TOP_P))
    for i, p in enumerate(TOP_P):
        ref = probs_from_logits(logits[i], p)
        assert (ref[tokens[:, i]] > 0).all(), "a token outside the nucleus was drawn"
        counts = torch.bincount(tokens[:, i], minlength=60).tolist()
        assert_chi_square(dict(enumerate(counts)), {t: q for t, q in enumerate(ref.tolist()) if q > 0}, n)


def test_top_p_keeps_every_token_tied_with_the_crossing_one():
    probs = torch.full((2000, 10), 0.1)  # sorted order would cut the tie at 5, arbitrarily
    tokens = draw_top_p(probs, torch.full((2000, 1), 0.5), [None] * 2000)
    assert set(tokens.tolist()) == set(range(10))


def test_draw_never_picks_a_zero_token_even_at_the_edges():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]).repeat(4000, 1)
    tokens = draw(probs, [None] * 4000)
    assert set(tokens.tolist()) == {1, 3}


def test_draw_at_the_top_of_the_unit_interval_stays_on_a_real_token(monkeypatch):
    """u * total can round up to total; the draw must still land on the last token of mass > 0."""
    import inferlab.sampling as sampling
    monkeypatch.setattr(sampling, "uniforms", lambda rows, width, gens, device: torch.ones(rows, width))
    assert draw(torch.tensor([[0.0, 0.3, 0.7, 0.0, 0.0]]), [None]).item() == 2


def test_sampled_frequencies_follow_each_rows_distribution():
    torch.manual_seed(0)
    params = MIX + [SamplingParams(temperature=1.5), SamplingParams(temperature=0)]
    logits = torch.randn(len(params), 50) * 2
    n = 4000
    tokens = sample(logits.repeat(n, 1), params * n, [None] * (len(params) * n)).view(n, len(params))
    for i, p in enumerate(params):
        freq = torch.bincount(tokens[:, i], minlength=50) / n
        expected = probs_from_logits(logits[i], p)
        assert (freq - expected).abs().max() < 0.03, (i, p)
        assert (freq[expected == 0] == 0).all()  # never a filtered-out token


def test_seeded_rows_repeat_whatever_shares_the_batch():
    torch.manual_seed(0)
    logits = torch.randn(3, 300)
    p = SamplingParams(temperature=1.0, top_p=0.95, seed=7)
    alone_gen, mixed_gen = make_generator(7, "cpu"), make_generator(7, "cpu")
    alone = [sample(logits[1:2], [p], [alone_gen]).item() for _ in range(20)]
    mixed = [sample(logits, [MIX[0], p, SamplingParams(temperature=0.9)], [None, mixed_gen, None])[1].item()
             for _ in range(20)]
    assert alone == mixed
    other = make_generator(8, "cpu")
    assert [sample(logits[1:2], [p], [other]).item() for _ in range(20)] != alone


def test_greedy_rows_take_the_first_maximum():
    logits = torch.zeros(2, 10)
    logits[:, 3] = logits[:, 6] = 1.0
    out = sample(logits, [SamplingParams(temperature=0), SamplingParams(temperature=0)], [None, None])
    assert out.tolist() == [3, 3]
