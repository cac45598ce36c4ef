"""The customer-service question set (``customer_service.json``) and the cache's evaluation on it.

The protocol: the first question of every *cached* intent seeds the cache with that intent's
answer (the first customer who asked). Every other question is a query:

* a paraphrase of a cached intent should hit, and is served the right answer if it does;
* a question of an uncached intent (a near miss: "reset my router" when only "reset my password"
  is cached) or an out-of-scope one should miss: a hit there serves a wrong answer.

For each threshold: hit rate = served / queries, precision = right answers / served, recall =
right answers / queries that had a right answer to serve.
"""
from __future__ import annotations

import dataclasses
import json
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


def near_miss_pairs(data: dict | None = None) -> list[tuple[str, str]]:
    """(uncached intent, the cached intent it resembles) pairs."""
    data = data or load()
    first = {it["name"]: it["questions"][0] for it in data["intents"]}
    return [(first[it["name"]], first[it["near_miss_of"]]) for it in data["intents"] if "near_miss_of" in it]
