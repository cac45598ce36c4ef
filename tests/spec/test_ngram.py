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


def test_copy_ceiling_counts_the_steps_of_a_lookup_that_knows_the_answer():
    """Prompt [1..5], answer [9, 1, 2, 3, 4, 7]: 9 comes from the prefill, then one verify copies
    1 2 3 (k = 3) and the target adds 4, then 7 is nowhere in the context: 2 steps for plain
    decoding's 5. A copy never reads past the context (the answer's own future), and a longer k
    copies more."""
    from inferlab.spec.ngram import copy_ceiling

    assert copy_ceiling([[1, 2, 3, 4, 5]], [[9, 1, 2, 3, 4, 7]], 3) == 5 / 2
    assert copy_ceiling([[1, 2, 3, 4, 5]], [[9, 1, 2, 3, 4, 7]], 1) == 5 / 3  # [1]+2, [3]+4, 7
    # each step copies only what the context already holds: after the prefill's 5 one 5 can be
    # copied (+ the target's 5), then two: 2 steps, where reading ahead into the answer would take 1
    assert copy_ceiling([[8]], [[5, 5, 5, 5, 5]], 8) == 4 / 2
    assert copy_ceiling([[1, 2]], [[3]], 4) == 0  # a one-token answer: no decode steps
    # never below 1 (a step emits at least one token), and the two prompts' steps add up
    two = copy_ceiling([[1, 2, 3, 4, 5], [8]], [[9, 1, 2, 3, 4, 7], [5, 5, 5, 5, 5]], 3)
    assert two == (5 + 4) / (2 + 2)
