"""The two decisions of notebook 07 as plain functions, and how to choose their thresholds on a
training split (lab 07's reference solution).

    nearest(keys, query)            cosine nearest neighbour by brute force: (index, similarity)
    lookup(keys, query, threshold)  the nearest index if similar enough, else -1 (a miss)
    serves(similarity, threshold)   the cache's rule: is a neighbour this similar served?
    choose_threshold(...)           the lowest threshold whose precision on training data is high enough
    route(score, threshold)         "small" or "large"  (inferlab.strategy.router.route, over router.to_small)
    choose_route_threshold(...)     the cheapest routing threshold whose quality on training data is high enough

A threshold chosen on one split is checked on another: one that only fits the training questions
serves wrong answers on new ones. ``SemanticCache`` (the capstone's cache) finds its neighbour with
``nearest`` and serves by ``serves``, and the capstone routes with ``router.route``: the functions
lab 07 grades are the ones the capstone runs.
"""
from __future__ import annotations

import math

import numpy as np

from inferlab.strategy.router import route, to_small

__all__ = ["nearest", "lookup", "serves", "choose_threshold", "route", "choose_route_threshold"]


def nearest(keys, query) -> tuple[int, float]:
    """The row of ``keys`` [n, d] with the highest cosine similarity to ``query`` [d] (the first on a
    tie) and that similarity; (-1, -inf) when ``keys`` is empty. Rows need not be unit length."""
    keys, query = np.asarray(keys, dtype=np.float64), np.asarray(query, dtype=np.float64)
    if len(keys) == 0:
        return -1, float("-inf")
    sims = keys @ query / np.maximum(np.linalg.norm(keys, axis=1) * np.linalg.norm(query), 1e-12)
    i = int(np.argmax(sims))
    return i, float(sims[i])


def serves(similarity, threshold: float):
    """The cache's rule, in one place: a neighbour at least ``threshold`` similar is served (one
    similarity or an array of them)."""
    return similarity >= threshold


def lookup(keys, query, threshold: float) -> int:
    """The nearest row if its cosine similarity is at least ``threshold``, else -1."""
    i, sim = nearest(keys, query)
    return i if i >= 0 and serves(sim, threshold) else -1


def choose_threshold(similarities, correct, min_precision: float) -> float:
    """The lowest threshold, among the ``similarities`` themselves, at which the queries served
    (similarity >= threshold) are right (``correct``) at least ``min_precision`` of the time;
    ``inf`` (serve nothing) when no threshold reaches it."""
    sims, ok = np.asarray(similarities, dtype=np.float64), np.asarray(correct, dtype=bool)
    for t in np.sort(np.unique(sims)):
        served = serves(sims, t)
        if ok[served].mean() >= min_precision:
            return float(t)
    return float("inf")


def choose_route_threshold(scores, small_nll, large_nll, cost_small: float, cost_large: float,
                           min_quality: float) -> float:
    """Among ``-inf`` (nothing to the small model) and the ``scores`` themselves, the threshold with
    the lowest cost whose quality, large-model perplexity / routed perplexity (perplexity = exp of
    the mean NLL over requests), is at least ``min_quality``; on a tie of cost, the lowest threshold."""
    s, ns, nl = (np.asarray(x, dtype=np.float64) for x in (scores, small_nll, large_nll))
    ppl_large = math.exp(nl.mean())
    best, best_cost = float("-inf"), float("inf")
    for t in [float("-inf")] + sorted(set(s.tolist())):
        small = to_small(s, t)
        cost = small.sum() * cost_small + (~small).sum() * cost_large
        quality = ppl_large / math.exp(np.where(small, ns, nl).mean())
        if quality >= min_quality and cost < best_cost:
            best, best_cost = t, cost
    return best
