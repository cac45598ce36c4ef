"""Lab 07: serving strategies. Write the five functions below.

A semantic cache answers a request from the cached request nearest in meaning, if it is similar
enough; a router sends a request to the small model when a cheap signal says it is easy. Both
hinge on a threshold, and both thresholds are chosen on training data and graded on new data.

Grade your work with `inferlab grade labs/07_serving_strategies`. Keep the names and signatures.
"""
import math

import numpy as np


def nearest(keys, query) -> tuple[int, float]:
    """The row of ``keys`` (shape [n, d]) with the highest cosine similarity to ``query`` (shape [d]),
    and that similarity, as (int, float). Rows need not have unit length. On a tie, the first row.
    With no rows at all: (-1, float("-inf"))."""
    raise NotImplementedError("about 5 lines")


def lookup(keys, query, threshold: float) -> int:
    """The index ``nearest`` finds if its similarity is at least ``threshold`` (a hit), else -1 (a miss)."""
    raise NotImplementedError("about 2 lines: reuse nearest")


def choose_threshold(similarities, correct, min_precision: float) -> float:
    """Pick the cache's threshold on training data.

    similarities[i]: the similarity of training query i to its nearest cached question;
    correct[i]: whether that cached question's answer is the right one for query i.
    At threshold t the cache serves the queries with similarity >= t; its precision is the share of
    those that are correct. Return the LOWEST t, taken among the similarities themselves, whose
    precision is at least ``min_precision``; float("inf") (serve nothing) if none reaches it.
    """
    raise NotImplementedError("about 6 lines")


def route(score: float, threshold: float) -> str:
    """"small" if ``score`` (the small model's mean NLL on the prompt) is at most ``threshold``, else "large"."""
    raise NotImplementedError("about 1 line")


def choose_route_threshold(scores, small_nll, large_nll, cost_small: float, cost_large: float,
                           min_quality: float) -> float:
    """Pick the router's threshold on a training workload.

    For request i: scores[i] is the routing signal, small_nll[i] / large_nll[i] the mean NLL of the
    true continuation under each model. A threshold t sends the requests with score <= t to the small
    model. Its cost is sum(cost_small for those) + sum(cost_large for the others); its quality is
    ppl_large / ppl_routed, where ppl = exp(mean over requests of the NLL each request got).
    Candidates: float("-inf") (nothing small) and every score. Return the candidate with the lowest
    cost whose quality is at least ``min_quality``; on equal cost, the lowest threshold.
    """
    raise NotImplementedError("about 10 lines")
