"""Prompt lookup: longest match first, most recent occurrence, the tokens that followed it."""
from __future__ import annotations

import pytest

from inferlab.spec import NgramProposer


def test_copies_what_followed_the_last_occurrence():
    prop = NgramProposer(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=2)
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 8, 9, 5, 6, 1, 2, 5, 6]
    # suffix (5, 6) occurs at 0 and 5; the most recent (5) was followed by 1, 2, 5
    assert prop.propose(tokens) == [1, 2, 5]


def test_longer_matches_win_over_recent_short_ones():
    prop = NgramProposer(num_speculative_tokens=2, prompt_lookup_min=1, prompt_lookup_max=3)
    tokens = [1, 2, 3, 40, 41, 9, 3, 50, 1, 2, 3]
    # (1, 2, 3) occurs at 0 -> 40, 41; the 1-gram (3,) last occurred at 6 -> 50
    assert prop.propose(tokens) == [40, 41]


def test_no_match_proposes_nothing_and_the_end_truncates():
    prop = NgramProposer(num_speculative_tokens=4, prompt_lookup_min=2, prompt_lookup_max=3)
    assert prop.propose([1, 2, 3, 4]) == []
    assert prop.propose([7]) == []
    assert prop.propose([1, 2, 9, 1, 2]) == [9, 1, 2]  # only three tokens follow the match


def test_on_real_text_the_guesses_are_what_followed():
    from inferlab.model.tokenizer import Tokenizer
    from inferlab.model.loader import resolve_model_path

    tok = Tokenizer.from_file(resolve_model_path("target") / "tokenizer.json")
    ids = tok.encode("def area(width, height):\n    return width * height\n\nprint(area(width")
    guess = NgramProposer(num_speculative_tokens=3, prompt_lookup_max=4).propose(ids)
    assert tok.decode(ids + guess).startswith(tok.decode(ids) + ",")


@pytest.mark.parametrize("kwargs", [dict(num_speculative_tokens=0),
                                    dict(num_speculative_tokens=2, prompt_lookup_min=3, prompt_lookup_max=2),
                                    dict(num_speculative_tokens=2, prompt_lookup_min=0)])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        NgramProposer(**kwargs)
