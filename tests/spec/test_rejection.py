"""The verifier emits exactly the target's distribution: exact enumeration on a toy vocabulary,
a chi-square test of the sampler itself, greedy and deterministic-draft edge cases."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from inferlab.sampling import make_generator
from inferlab.spec import expected_tokens_per_step, predicted_speedup, recovered_probs, rejection_sample

V = 4


def toy_tables(seed: int):
    """p(. | last token) and q(. | last token) on a 4-token vocabulary: two different 'models'."""
    g = torch.Generator().manual_seed(seed)
    p = (1.5 * torch.randn(V, V, generator=g)).softmax(-1)
    q = (1.5 * torch.randn(V, V, generator=g)).softmax(-1)
    return p.double(), q.double()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("deterministic", [False, True])
def test_exact_enumeration_of_one_step(seed, deterministic):
    """Enumerate every guess sequence of a k=2 step and every accept/reject outcome, with the
    acceptance rule min(1, p/q) and the residual; the probability that the step's first two
    emitted tokens (continuing with the target when the step emits one) are (a, b) must be
    p(a | c) p(b | a)."""
    p, q = toy_tables(seed)
    c = 0
    # A deterministic proposer always guesses the same two tokens (q one-hot).
    fixed = (2, 1)
    joint = torch.zeros(V, V, dtype=torch.float64)
    for x1, x2 in itertools.product(range(V), repeat=2):
        if deterministic:
            if (x1, x2) != fixed:
                continue
            prob_guess, q1, q2 = 1.0, torch.eye(V, dtype=torch.float64)[x1], torch.eye(V, dtype=torch.float64)[x2]
        else:
            prob_guess, q1, q2 = (q[c, x1] * q[x1, x2]).item(), q[c], q[x1]
        p1, p2 = p[c], p[x1]
        a1 = min(1.0, (p1[x1] / q1[x1]).item())
        a2 = min(1.0, (p2[x2] / q2[x2]).item())
        # rejected at 1: first token from the residual, second from the target afterwards
        r1 = recovered_probs(p1[None], q1[None])[0]
        joint += prob_guess * (1 - a1) * r1[:, None] * p
        # accepted 1, rejected 2: (x1, residual)
        r2 = recovered_probs(p2[None], q2[None])[0]
        joint[x1] += prob_guess * a1 * (1 - a2) * r2
        # both accepted: (x1, x2) then a bonus token
        joint[x1, x2] += prob_guess * a1 * a2
    expected = p[c][:, None] * p
    assert torch.allclose(joint, expected, atol=1e-12)


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


def test_speedup_formula():
    # Leviathan et al. 2023, fig. 3 reads e.g. alpha 0.8, k 4, c 0.05 -> about 3.1x
    assert predicted_speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8 ** 5) / (0.2 * 1.2))
    assert expected_tokens_per_step(1.0, 3) == 4
    assert expected_tokens_per_step(0.0, 3) == 1
    assert predicted_speedup(0.0, 2, 0.5) == pytest.approx(0.5)  # all rejected: pure cost


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
