"""The customer-service question set (``customer_service.json``) and the cache's evaluation on it.

The protocol: the first question of every *cached* intent seeds the cache with that intent's
answer (the first customer who asked). Every other question is a query:

* a paraphrase of a cached intent should hit, and is served the right answer if it does;
* a question of an uncached intent (a near miss: "reset my router" when only "reset my password"
  is cached) or an out-of-scope one should miss: a hit there serves a wrong answer.

For each threshold: hit rate = served / queries, precision = right answers / served, recall =
right answers / queries that had a right answer to serve.

For answers a model writes (smollm2, with the shop's FAQ as its system prompt: ``faq_system_prompt``),
each intent's ``fact`` is a case-insensitive regular expression a grounded answer contains: the
answer's key detail (a number, a menu path, a time limit). ``grounded(answer, intent)`` checks it;
a near miss's fact never matches the answer of the intent it resembles, so an answer served to
the wrong question reads as ungrounded. ``conversations`` are two-turn exchanges whose second
turn decides the intent.
"""
from __future__ import annotations

import dataclasses
import json
import re
from functools import lru_cache
from pathlib import Path

import numpy as np

DATA = Path(__file__).with_name("customer_service.json")


@lru_cache(maxsize=1)
def load() -> dict:
    return json.loads(DATA.read_text())


@dataclasses.dataclass(frozen=True)
class Query:
    text: str
    intent: str | None      # None: out of scope
    topic: str | None
    answerable: bool        # its intent is in the cache


def split(data: dict | None = None) -> tuple[list[dict], list[Query]]:
    """(seeds, queries): seeds are {"question", "answer", "intent", "topic"} for the cached intents."""
    data = data or load()
    seeds, queries = [], []
    for it in data["intents"]:
        qs = it["questions"]
        if it["cached"]:
            seeds.append({"question": qs[0], "answer": it["answer"], "intent": it["name"], "topic": it["topic"]})
            qs = qs[1:]
        queries += [Query(q, it["name"], it["topic"], it["cached"]) for q in qs]
    queries += [Query(q, None, None, False) for q in data["out_of_scope"]]
    return seeds, queries


def halves(queries: list[Query]) -> tuple[list[int], list[int]]:
    """The two splits of ``queries``, by position: even (calibration: where a threshold is chosen)
    and odd (held out: where it is checked, and what the capstone's customers ask)."""
    return list(range(0, len(queries), 2)), list(range(1, len(queries), 2))


def held_out_questions(data: dict | None = None) -> set[str]:
    """The questions of the held-out half (``halves``), which no threshold was chosen on."""
    _, queries = split(data)
    return {queries[i].text for i in halves(queries)[1]}


def nearest_table(embedder, seeds: list[dict], queries: list[Query], scoped: bool = False) -> dict:
    """For every query: the nearest seed's similarity and intent (within the query's topic if
    ``scoped``; an out-of-scope query then has no topic and nothing to match)."""
    keys = embedder.embed([s["question"] for s in seeds])
    emb = embedder.embed([q.text for q in queries])
    sims = emb @ keys.T
    if scoped:
        same = np.array([[q.topic is not None and q.topic == s["topic"] for s in seeds] for q in queries])
        sims = np.where(same, sims, -np.inf)
    best = sims.argmax(1)
    return {"similarity": sims[np.arange(len(queries)), best],
            "intent": [seeds[j]["intent"] if np.isfinite(sims[i, j]) else None for i, j in enumerate(best)],
            "truth": [q.intent for q in queries], "answerable": np.array([q.answerable for q in queries])}


def sweep(table: dict, thresholds, generate_s: float = 0.0, lookup_s: float = 0.0) -> list[dict]:
    """Hit rate, precision, recall and wrong answers served at each threshold. With the seconds of
    one generation and one lookup: the mean latency saved per request (a miss pays the lookup)."""
    sim = table["similarity"]
    right = np.array([p == t and t is not None for p, t in zip(table["intent"], table["truth"])])
    rows = []
    for t in thresholds:
        served = sim >= t
        n_served, n_right = int(served.sum()), int((served & right).sum())
        hit_rate = n_served / len(sim)
        rows.append({"threshold": float(t), "hit_rate": hit_rate, "served": n_served, "right": n_right,
                     "wrong": n_served - n_right,
                     "precision": n_right / n_served if n_served else 1.0,
                     "recall": n_right / max(int(table["answerable"].sum()), 1),
                     "latency_saved_s": hit_rate * generate_s - lookup_s})
    return rows


def calibrated(embedder, min_precision: float = 0.9, seeds: list[dict] | None = None,
               queries: list[Query] | None = None) -> dict:
    """One global threshold with a stated error bound, as a deployment would set it: on the
    even-numbered queries (the calibration split) the lowest threshold whose served answers are
    right at least ``min_precision`` of the time (``thresholds.choose_threshold``, lab 07's
    reference); then, on the odd-numbered ones (held out), what that threshold serves. No topic
    scope: the customer does not always pick the right menu. Returns the threshold, and for the
    held-out split: hit rate, precision, recall, and how many paraphrases of cached questions,
    near misses and out-of-scope questions were served (the last two are always wrong)."""
    from inferlab.strategy.thresholds import choose_threshold, serves

    if seeds is None or queries is None:
        seeds, queries = split()
    table = nearest_table(embedder, seeds, queries)
    right = np.array([p == t and t is not None for p, t in zip(table["intent"], table["truth"])])
    cal, held = (np.array(h) for h in halves(queries))
    t = choose_threshold(table["similarity"][cal], right[cal], min_precision)
    served = serves(table["similarity"][held], t)
    kinds = np.array(["paraphrases" if queries[i].answerable else "near_misses" if queries[i].intent else "out_of_scope"
                      for i in held])
    n_served, n_right = int(served.sum()), int((served & right[held]).sum())
    return {"embedder": getattr(embedder, "name", type(embedder).__name__), "min_precision": min_precision,
            "threshold": t, "held_out": len(held), "served": n_served, "right": n_right,
            "hit_rate": n_served / len(held), "precision": n_right / n_served if n_served else 1.0,
            "recall": n_right / max(int(table["answerable"][held].sum()), 1),
            **{f"served_{k}": int((served & (kinds == k)).sum()) for k in ("paraphrases", "near_misses", "out_of_scope")},
            **{k: int((kinds == k).sum()) for k in ("paraphrases", "near_misses", "out_of_scope")}}


def near_miss_pairs(data: dict | None = None) -> list[tuple[str, str]]:
    """(uncached intent, the cached intent it resembles) pairs."""
    data = data or load()
    first = {it["name"]: it["questions"][0] for it in data["intents"]}
    return [(first[it["name"]], first[it["near_miss_of"]]) for it in data["intents"] if "near_miss_of" in it]


def faq_system_prompt(data: dict | None = None) -> str:
    """The shop's FAQ as one system prompt, every intent's first question and its answer: the
    prefix every request shares (what prefix caching has to share on this workload)."""
    data = data or load()
    lines = ["You are the customer-service assistant of a shop that sells devices, home internet and a "
             "streaming subscription. Answer in one or two sentences, using only the FAQ below; if the FAQ "
             "does not cover the question, say that you can only help with the shop's services.", "", "FAQ:"]
    for it in data["intents"]:
        lines += [f"Q: {it['questions'][0]}", f"A: {it['answer']}"]
    return "\n".join(lines)


def grounded(answer: str, intent: str, data: dict | None = None) -> bool:
    """Does ``answer`` state the FAQ fact that ``intent`` names (its ``fact`` pattern)?"""
    data = data or load()
    fact = next((it["fact"] for it in data["intents"] if it["name"] == intent), None)
    if fact is None:
        raise ValueError(f"unknown intent {intent!r}: choose one of customer_service.json's intents")
    return re.search(fact, answer, re.IGNORECASE) is not None


def conversations(data: dict | None = None) -> list[dict]:
    """The two-turn exchanges: {"intent", "turns": [first user message, second]}."""
    return list((data or load())["conversations"])


def answers(data: dict | None = None) -> dict[str, str]:
    """{intent name: the FAQ's written answer}, for every intent (cached or not)."""
    return {it["name"]: it["answer"] for it in (data or load())["intents"]}


def faq_requests(prompter, queries) -> list[tuple[list[int], list[int], int]]:
    """(prompt, reference answer, question start) token triples for a chat model: each labelled
    question (out-of-scope ones have no reference and are left out) as ``prompter`` builds its chat
    prompt (``workload.ChatPrompter``), the FAQ's written answer of its intent as the continuation,
    and where the customer's words start (the router reads only those: every prompt shares the rest)."""
    answer = answers()
    out = []
    for q in queries:
        if q.intent is None:
            continue
        ids, start = prompter.parts(q.text)
        out.append((ids, prompter.tokenizer.encode(" " + answer[q.intent], add_special_tokens=False), start))
    return out
