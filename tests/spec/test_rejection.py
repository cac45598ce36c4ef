"""The verifier emits exactly the target's distribution: exact enumeration on a toy vocabulary,
a chi-square test of the sampler itself, greedy and deterministic-draft edge cases."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from inferlab.sampling import make_generator
from inferlab.spec import expected_tokens_per_step, predicted_speedup, rejection, rejection_sample
from inferlab.spec.rejection import mixed_speedup

V = 4


def toy_tables(seed: int):
    """p(. | last token) and q(. | last token) on a 4-token vocabulary: two different 'models'."""
    g = torch.Generator().manual_seed(seed)
    p = (1.5 * torch.randn(V, V, generator=g)).softmax(-1)
    q = (1.5 * torch.randn(V, V, generator=g)).softmax(-1)
    return p.double(), q.double()


def exact_outcomes(guesses: list[int], target: torch.Tensor, draft: torch.Tensor | None, monkeypatch):
    """Every outcome of ``rejection_sample`` on one sequence, read from the function itself:
    [(probability, accepted guesses, distribution of the last token)].

    The acceptance draws are the only randomness before the last token: the probability that
    guess j passes is the length of the interval of u_j the function accepts (found by bisection,
    the earlier guesses passing at u = 0), and the last token's distribution is the row the
    function hands to the sampler (normalised as the sampler normalises it)."""
    rows = []
    monkeypatch.setattr(rejection, "draw", lambda probs, gens: (rows.append(probs.double()),
                                                                 torch.zeros(len(probs), dtype=torch.long))[1])

    def run(u_j: float, j: int) -> tuple[int, torch.Tensor]:
        u = torch.zeros(1, max(len(guesses), 1), dtype=target.dtype)
        if j < len(guesses):
            u[0, j] = u_j
        rows.clear()
        n = len(rejection_sample([guesses], target, draft, uniforms=u)[0]) - 1
        return n, rows[0][0] / rows[0][0].sum()

    outcomes, reach = [], 1.0
    for j in range(len(guesses)):
        lo, hi = 0.0, 1.0
        if run(1 - 1e-15, j)[0] > j:
            lo = hi
        else:
            for _ in range(60):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if run(mid, j)[0] > j else (lo, mid)
        if lo < 1:
            n, dist = run((1 + lo) / 2, j)
            assert n == j
            outcomes.append((reach * (1 - lo), guesses[:j], dist))
        reach *= lo
        if reach == 0:
            return outcomes
    n, dist = run(0.0, len(guesses))
    assert n == len(guesses)
    return outcomes + [(reach, list(guesses), dist)]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("deterministic", [False, True])
def test_exact_enumeration_of_one_step(seed, deterministic, monkeypatch):
    """Enumerate every guess pair of a k=2 step and every outcome ``rejection_sample`` gives it;
    the probability that the step's first three tokens (continuing with the target when the step
    emits fewer) are (a, b, c) must be p(a | 0) p(b | a) p(c | b): the residual and the bonus
    token both count."""
    p, q = toy_tables(seed)
    eye = torch.eye(V, dtype=torch.float64)
    joint = torch.zeros(V, V, V, dtype=torch.float64)
    for x1, x2 in itertools.product(range(V), repeat=2):
        if deterministic:  # a proposer with no distribution always guesses (2, 1)
            if (x1, x2) != (2, 1):
                continue
            prob_guess, draft = 1.0, None
        else:
            prob_guess, draft = (q[0, x1] * q[x1, x2]).item(), torch.stack([q[0], q[x1]])
        target = torch.stack([p[0], p[x1], p[x2]])
        for prob, kept, dist in exact_outcomes([x1, x2], target, draft, monkeypatch):
            first = [eye[t] for t in kept] + [dist]
            a = first[0]
            b = first[1] if len(first) > 1 else None
            c = first[2] if len(first) > 2 else None
            # a token the step did not emit comes from the target, given the one before it
            b_given_a = b[None, :].expand(V, V) if b is not None else p
            abc = a[:, None, None] * b_given_a[:, :, None] * (c[None, None, :] if c is not None else p[None, :, :])
            joint += prob_guess * prob * abc
    expected = p[0][:, None, None] * p[:, :, None] * p[None, :, :]
    assert torch.allclose(joint, expected, atol=1e-9), (joint - expected).abs().max()


def chi2_critical(dof: int, z: float = 3.29) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.29: the 99.95th)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def simulate(p, q, n, deterministic, seed):
    """n independent k=2 steps from context 0, batched in one verifier call; returns the first
    two tokens of each (continuing with the target when a step emitted one)."""
    g = torch.Generator().manual_seed(seed)
    p, q = p.float(), q.float()
    if deterministic:
        x1 = torch.full((n,), 2)
        x2 = torch.full((n,), 1)
    else:
        x1 = torch.multinomial(q[0].expand(n, V), 1, generator=g)[:, 0]
        x2 = torch.multinomial(q[x1], 1, generator=g)[:, 0]
    target = torch.stack([p[0].expand(n, V), p[x1], p[x2]], 1).reshape(3 * n, V)
    draft = None if deterministic else torch.stack([q[0].expand(n, V), q[x1]], 1).reshape(2 * n, V)
    torch.manual_seed(seed)
    out = rejection_sample([[a, b] for a, b in zip(x1.tolist(), x2.tolist())], target, draft)
    pairs = []
    for emitted in out:
        if len(emitted) == 1:
            emitted = emitted + torch.multinomial(p[emitted[0]], 1, generator=g).tolist()
        pairs.append(emitted[0] * V + emitted[1])
    return torch.bincount(torch.tensor(pairs), minlength=V * V).double()


@pytest.mark.parametrize("deterministic", [False, True])
def test_sampled_steps_follow_the_target(deterministic):
    p, q = toy_tables(0)
    n = 6000
    counts = simulate(p, q, n, deterministic, seed=1)
    expected = (p[0][:, None] * p).flatten() * n
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < chi2_critical(V * V - 1), chi2
    # The test can fail: the draft's own joint (what a verifier that accepted everything emits)
    # is far from the target's.
    wrong = (q[0][:, None] * q).flatten() * n
    assert ((counts - wrong) ** 2 / wrong).sum().item() > 10 * chi2_critical(V * V - 1)


def test_greedy_accepts_while_the_guess_is_the_argmax():
    """Greedy p is one-hot: the guesses pass up to the first mismatch, then the argmax follows."""
    argmaxes = [3, 1, 0, 2]  # target's argmax at each of the 4 rows of a k=3 step
    p = torch.nn.functional.one_hot(torch.tensor(argmaxes), 5).float()
    assert rejection_sample([[3, 1, 4]], p) == [[3, 1, 0]]
    assert rejection_sample([[3, 1, 0]], p) == [[3, 1, 0, 2]]  # all accepted, bonus token
    assert rejection_sample([[0, 1, 0]], p) == [[3]]


def test_batch_with_mixed_guess_counts_and_explicit_uniforms():
    """Rows of different k share one call; u < p/q accepts, u >= p/q rejects, and a rejected
    guess never comes back from the residual max(0, p - q)."""
    p = torch.full((6, 5), 0.2)  # sequence 0: k=2 (3 rows), 1: k=0 (1 row), 2: k=1 (2 rows)
    q = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.6]).expand(3, 5)  # p/q = 1/3 at token 4
    u = torch.tensor([[0.30, 0.34], [0.0, 0.0], [0.5, 0.0]])
    for _ in range(20):
        out = rejection_sample([[4, 4], [], [4]], p, q, uniforms=u)
        assert [len(x) for x in out] == [2, 1, 1]
        assert out[0][0] == 4 and out[0][1] != 4 and out[2][0] != 4


def test_rejected_guess_is_never_the_recovered_token_for_a_deterministic_draft():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    for _ in range(50):
        out = rejection_sample([[0]], p, uniforms=torch.tensor([[0.99]]))
        assert out == [[1]]  # rejected 0: p with 0 removed is all on token 1


def test_seeded_rows_do_not_depend_on_their_neighbours():
    p, q = toy_tables(3)
    target = torch.cat([p[0], p[1], p[2]]).float().reshape(3, V)
    draft = torch.cat([q[0], q[1]]).float().reshape(2, V)

    def run(neighbours):
        gens = [make_generator(11, "cpu")] + [None] * neighbours
        return rejection_sample([[1, 2]] * (1 + neighbours), target.repeat(1 + neighbours, 1),
                                draft.repeat(1 + neighbours, 1), gens)[0]

    assert all(run(0) == run(n) for n in (1, 5, 9))


def test_wrong_row_counts_are_refused():
    with pytest.raises(ValueError, match="sum"):
        rejection_sample([[1, 2]], torch.full((2, 4), 0.25))


@pytest.mark.parametrize("alpha, k, c, v", [(0.8, 4, 0.05, 1.0), (0.5, 3, 0.2, 1.3), (0.95, 6, 0.1, 1.0)])
def test_speedup_formula_matches_simulated_steps(alpha, k, c, v):
    """Leviathan's speedup, against steps of the verifier itself: every guess passes with
    probability alpha (a proposer with no distribution, p = alpha at its guess), a step costs k
    draft forwards of c and one verify forward of v, and plain decoding one forward per token."""
    n = 6000
    guess_row = torch.tensor([alpha, 1 - alpha])
    target = torch.cat([guess_row.expand(k, 2), torch.tensor([[0.5, 0.5]])]).repeat(n, 1)
    torch.manual_seed(0)
    tokens = sum(len(emitted) for emitted in rejection_sample([[0] * k] * n, target))
    assert expected_tokens_per_step(alpha, k) == pytest.approx(tokens / n, rel=0.02)
    assert predicted_speedup(alpha, k, c, v) == pytest.approx(tokens / (n * (k * c + v)), rel=0.02)


def test_speedup_formula_edges():
    assert expected_tokens_per_step(1.0, 3) == 4
    assert expected_tokens_per_step(0.0, 3) == 1
    assert predicted_speedup(0.0, 2, 0.5) == pytest.approx(0.5)  # all rejected: pure cost


def test_mixed_speedup_prices_steps_with_and_without_guesses():
    """Every step with guesses: Leviathan's formula; none: plain decoding (1, or 1 / w on a machine
    slower by w); half and half: total tokens over total cost, counted by hand."""
    alpha, k, c, v = 0.7, 3, 0.1, 1.2
    tokens = expected_tokens_per_step(alpha, k)
    assert mixed_speedup(1.0, tokens, k * c, v) == pytest.approx(predicted_speedup(alpha, k, c, v))
    assert mixed_speedup(0.0, tokens, k * c, v) == 1.0 and mixed_speedup(0.0, tokens, k * c, v, w=1.25) == 0.8
    assert mixed_speedup(0.5, 3.0, 0.3, 1.5, w=1.1) == pytest.approx((3.0 + 1) / (0.3 + 1.5 + 1.1))


def test_no_guesses_is_plain_sampling_from_the_target():
    """k = 0 for every row: one draw from p each (the exponential race), frequencies follow p."""
    p = torch.tensor([0.5, 0.25, 0.15, 0.1])
    n = 8000
    torch.manual_seed(0)
    out = rejection_sample([[]] * n, p.expand(n, 4).contiguous())
    counts = torch.bincount(torch.tensor([x[0] for x in out]), minlength=4).double()
    chi2 = ((counts - p * n) ** 2 / (p * n)).sum().item()
    assert chi2 < chi2_critical(3), chi2


def test_greedy_verify_matches_rejection_sampling_on_one_hot_rows():
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        ks = torch.randint(0, 4, (3,), generator=g).tolist()
        guesses = [torch.randint(0, 3, (k,), generator=g).tolist() for k in ks]
        argmax = torch.randint(0, 3, (sum(ks) + 3,), generator=g)
        p = torch.nn.functional.one_hot(argmax, 3).float()
        from inferlab.spec import greedy_verify
        assert greedy_verify(guesses, argmax) == rejection_sample(guesses, p)


def test_a_draw_equal_to_the_ratio_rejects():
    """u < p/q accepts and u = p/q rejects, so a guess the target gives probability 0 never passes,
    even with u = 0."""
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    assert rejection_sample([[0]], p, uniforms=torch.tensor([[0.5]])) == [[1]]  # rejected: p without 0
    kept = rejection_sample([[0]], p, uniforms=torch.tensor([[0.4999]]))[0]
    assert kept[0] == 0 and len(kept) == 2  # accepted, then the bonus token
    zero = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    assert rejection_sample([[0]], zero, uniforms=torch.tensor([[0.0]])) == [[1]]


def test_the_residual_is_normalised():
    """norm(max(0, p - q)), worked by hand: only token 0 has p > q, so a rejection emits it."""
    p = torch.tensor([[0.5, 0.3, 0.2], [0.25, 0.25, 0.5]])
    q = torch.tensor([[0.2, 0.5, 0.3], [0.5, 0.25, 0.25]])
    torch.testing.assert_close(rejection.recovered_probs(p, q), torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]))
