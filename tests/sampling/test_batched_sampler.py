"""The batched sampler against the one-row reference ``probs_from_logits``.

``sample`` draws for a whole batch in one pass (per-row tensors, candidates from one topk, the
exponential race); each row must still follow its own request's distribution, and a seeded row
must not depend on what else shares its batch."""
import pytest
import torch

from inferlab.sampling import SamplingParams, candidate_probs, make_generator, probs_from_logits, sample

MIX = [SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=1.3, top_p=0.8),
       SamplingParams(temperature=0.5, top_k=10, top_p=0.5), SamplingParams(temperature=1.0, top_p=0.9),
       SamplingParams(temperature=2.0, top_k=40, top_p=0.99), SamplingParams(temperature=1.0, top_k=1)]


def _full(logits, params):
    scaled = logits / torch.tensor([p.temperature for p in params])[:, None]
    probs, idx = candidate_probs(scaled, params)
    full = torch.zeros_like(logits).scatter_(1, idx, probs)
    return full / full.sum(-1, keepdim=True), idx.shape[1]


@pytest.mark.parametrize("ties", [False, True], ids=["candidates", "ties-force-full-sort"])
def test_candidate_distribution_is_each_rows_reference(ties):
    torch.manual_seed(0)
    logits = torch.randn(len(MIX), 600) * 4
    if ties:
        logits[0, :300] = 30.0  # top-k 5 inside a tie of 300 values, past the candidates: all 300 stay
    full, width = _full(logits, MIX)
    assert width == (600 if ties else 257)  # 256 candidates for top-p alone, + 1 to see a tie at the edge
    for i, p in enumerate(MIX):
        torch.testing.assert_close(full[i], probs_from_logits(logits[i], p), atol=1e-6, rtol=1e-5)


def test_top_p_without_top_k_beyond_the_first_candidates():
    logits = torch.zeros(1, 1000)  # flat: top-p 0.9 needs 900 tokens, more than the first 256
    full, width = _full(logits, [SamplingParams(top_p=0.9)])
    assert width == 1000
    torch.testing.assert_close(full[0], probs_from_logits(logits[0], SamplingParams(top_p=0.9)))


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
