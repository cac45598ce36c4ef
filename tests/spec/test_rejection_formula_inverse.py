"""Leviathan's a is a per-position acceptance: recovered from the tokens a verify step emits, it
gives those tokens back, and it exceeds the share of guesses kept whenever k > 1."""
import pytest

from inferlab.spec.rejection import alpha_from_tokens_per_step, expected_tokens_per_step


@pytest.mark.parametrize("k", [1, 2, 4, 7])
@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.5, 0.83, 1.0])
def test_alpha_round_trips(alpha, k):
    length = expected_tokens_per_step(alpha, k)
    assert alpha_from_tokens_per_step(length, k) == pytest.approx(alpha, abs=1e-6)  # the formula cancels near 1


def test_share_of_guesses_kept_understates_alpha():
    alpha, k = 0.6, 4
    kept_share = (expected_tokens_per_step(alpha, k) - 1) / k  # accepted / proposed under the model
    assert kept_share < alpha - 0.1
    assert alpha_from_tokens_per_step(1 + kept_share * k, k) == pytest.approx(alpha)
