"""The customer-service set's grounding labels: every answer states its own fact, a near miss's fact
is absent from the answer it would be wrongly served, and the FAQ prompt carries every fact."""
from __future__ import annotations

import pytest

from inferlab.strategy import questions


def test_every_answer_states_its_own_fact():
    data = questions.load()
    for it in data["intents"]:
        assert questions.grounded(it["answer"], it["name"]), it["name"]


def test_an_answer_served_to_a_near_miss_is_not_grounded():
    """The cache's wrong answer: a near miss served the answer of the intent it resembles."""
    by_name = {it["name"]: it for it in questions.load()["intents"]}
    pairs = [(it["name"], it["near_miss_of"]) for it in by_name.values() if "near_miss_of" in it]
    assert len(pairs) >= 9
    for miss, cached in pairs:
        assert not questions.grounded(by_name[cached]["answer"], miss), (miss, cached)


def test_faq_prompt_and_conversations():
    data = questions.load()
    prompt = questions.faq_system_prompt()
    assert all(questions.grounded(prompt, it["name"]) for it in data["intents"])
    convs = questions.conversations()
    names = {it["name"] for it in data["intents"]}
    assert len(convs) >= 5 and all(c["intent"] in names and len(c["turns"]) == 2 for c in convs)
    labelled = sum(len(it["questions"]) for it in data["intents"]) + len(data["out_of_scope"]) + len(convs)
    assert labelled >= 60
    with pytest.raises(ValueError, match="unknown intent"):
        questions.grounded("x", "no_such_intent")
