"""Graded tests for lab 07. `inferlab grade labs/07_serving_strategies` runs them against starter.py;
with --reference they run against inferlab.strategy.thresholds, the reference solution. The held-out
tests embed the course's customer-service questions with MiniLM, the capstone's embedder, and score
code requests with the embedded model pair (see the README for why the router is graded there)."""
import math

import numpy as np
import pytest

from inferlab import labkit

lab = labkit.implementation(__file__, reference="inferlab.strategy.thresholds", functions=[
    "nearest", "lookup", "choose_threshold", "route", "choose_route_threshold"])

INF = float("inf")


# ---------------------------------------------------------------- the cache's lookup

@labkit.points(2)
def test_nearest_is_cosine_not_dot_product():
    keys = np.array([[10.0, 0.0], [0.6, 0.8], [0.0, 3.0]])
    got = labkit.check(lab.nearest, keys, np.array([0.6, 0.8]), expected=(1, 1.0), rel=1e-6)
    labkit.expect(isinstance(got[0], (int, np.integer)), "the index is an int", returned=got)
    i, s = lab.nearest(keys, np.array([1.0, 1.0]))
    labkit.expect(i == 1 and abs(s - 1.4 / math.sqrt(2)) < 1e-6,
                  "[0.6, 0.8] is nearest to [1, 1] by cosine (the long [10, 0] only wins a dot product)",
                  returned=(i, s))


@labkit.points(1)
def test_nearest_ties_and_empty():
    labkit.check(lab.nearest, np.array([[0.0, 1.0], [0.0, 2.0]]), np.array([0.0, 5.0]), expected=(0, 1.0), rel=1e-6)
    labkit.check(lab.nearest, np.zeros((0, 3)), np.ones(3), expected=(-1, float("-inf")))


@labkit.points(1)
def test_lookup_threshold_is_inclusive():
    keys = np.array([[1.0, 0.0], [0.0, 1.0]])
    q = np.array([0.8, 0.6])
    labkit.check(lab.lookup, keys, q, 0.8, expected=0)
    labkit.check(lab.lookup, keys, q, 0.81, expected=-1)
    labkit.check(lab.lookup, keys, np.array([0.0, -1.0]), -1.0, expected=0)


@labkit.points(2)
def test_choose_threshold_small_cases():
    sims, ok = [0.9, 0.8, 0.7, 0.6, 0.5], [True, True, False, True, False]
    labkit.check(lab.choose_threshold, sims, ok, 1.0, expected=0.8)
    labkit.check(lab.choose_threshold, sims, ok, 0.75, expected=0.6)      # 3 right of 4 served
    labkit.check(lab.choose_threshold, sims, ok, 0.6, expected=0.5)
    labkit.check(lab.choose_threshold, [0.9, 0.8], [False, False], 0.5, expected=INF)


@pytest.fixture(scope="module")
def questions():
    """MiniLM embeddings of the question set (the capstone's cache embeds with it); even-numbered
    queries train, odd ones are held out."""
    from inferlab.strategy import questions as Q
    from inferlab.strategy.embed import MiniLMEmbedder

    minilm = MiniLMEmbedder()
    seeds, queries = Q.split()
    return (minilm.embed([s["question"] for s in seeds]), [s["intent"] for s in seeds],
            minilm.embed([q.text for q in queries]), queries)


@labkit.points(4)
def test_cache_on_held_out_questions(questions):
    keys, intents, emb, queries = questions
    train = range(0, len(queries), 2)
    sims, ok = [], []
    for i in train:
        j, s = lab.nearest(keys, emb[i])
        sims.append(s)
        ok.append(intents[j] == queries[i].intent)
    t = lab.choose_threshold(sims, ok, 0.9)
    served = right = 0
    held_out = range(1, len(queries), 2)
    for i in held_out:
        j = lab.lookup(keys, emb[i], t)
        if j >= 0:
            served += 1
            right += intents[j] == queries[i].intent
    answerable = sum(queries[i].answerable for i in held_out)
    precision, recall = right / max(served, 1), right / answerable
    labkit.expect(precision >= 0.85 and recall >= 0.5,
                  "on the held-out questions the cache must serve right answers (precision >= 0.85) "
                  "to at least half of the answerable ones (recall)",
                  threshold=t, served=served, right=right, precision=round(precision, 3), recall=round(recall, 3))


@labkit.points(2)
def test_the_capstone_cache_runs_your_nearest(questions):
    """The capstone's SemanticCache searches with the nearest function it is given: with yours, every
    held-out question gets the entry the reference finds, and the same hits at the same threshold."""
    from inferlab.strategy import thresholds
    from inferlab.strategy.semantic_cache import SemanticCache

    keys, intents, emb, queries = questions

    class Given:  # the embeddings are computed once, by the fixture
        dim = keys.shape[1]

    caches = {}
    for name, search in (("yours", lab.nearest), ("reference", thresholds.nearest)):
        cache = SemanticCache(Given(), threshold=0.7, capacity=len(keys), nearest=search)
        for k, intent in zip(keys, intents):
            cache.insert(intent, intent, embedding=k)
        caches[name] = [(h.answer if (h := cache.lookup("", embedding=e)) else None) for e in emb[1::2]]
    wrong = sum(a != b for a, b in zip(caches["yours"], caches["reference"]))
    labkit.expect(wrong == 0, "SemanticCache(nearest=your nearest) must serve what it serves with the reference's",
                  differing=wrong, of=len(caches["yours"]))


# ---------------------------------------------------------------- the router

@labkit.points(1)
def test_route():
    labkit.check(lab.route, 2.0, 3.0, expected="small")
    labkit.check(lab.route, 3.0, 3.0, expected="small")
    labkit.check(lab.route, 3.5, 3.0, expected="large")


@labkit.points(2)
def test_choose_route_threshold_small_cases():
    scores, ns, nl = [1.0, 2.0, 3.0], [1.0, 2.0, 5.0], [1.0, 1.0, 1.0]
    labkit.check(lab.choose_route_threshold, scores, ns, nl, 1, 4, 1.0, expected=1.0)   # only the first is free
    q2 = 1 / math.exp(1 / 3)                                                              # quality with two small
    labkit.check(lab.choose_route_threshold, scores, ns, nl, 1, 4, q2, expected=2.0)
    labkit.check(lab.choose_route_threshold, scores, ns, nl, 1, 4, 0.0, expected=3.0)
    labkit.check(lab.choose_route_threshold, scores, [9.0, 9.0, 9.0], nl, 1, 4, 0.99, expected=float("-inf"))


@pytest.fixture(scope="module")
def workloads():
    """Code requests scored by the embedded pair (draft = small, target = large): train and held out."""
    from inferlab.model.loader import load_checkpoint
    from inferlab.strategy import router as R

    small, tok = load_checkpoint("draft", device="cpu")
    large, _ = load_checkpoint("target", device="cpu")
    code = R.CodeCorpus(tok)  # tokenized once for both workloads
    return [R.score_requests(small, large, R.code_requests(code, 48, 32, 16, seed=s)) for s in (1, 2)]


COST_SMALL, COST_LARGE = 1.0, 4.0   # per request, as measured at batch 16 on a quiet machine


@labkit.points(4)
def test_router_on_held_out_workload(workloads):
    train, held = workloads
    t = lab.choose_route_threshold(train["score"], train["small_nll"], train["large_nll"], COST_SMALL, COST_LARGE, 0.9)
    small = np.array([lab.route(float(s), t) == "small" for s in held["score"]])
    cost = (small.sum() * COST_SMALL + (~small).sum() * COST_LARGE) / (len(small) * COST_LARGE)
    quality = math.exp(held["large_nll"].mean()) / math.exp(np.where(small, held["small_nll"], held["large_nll"]).mean())
    labkit.expect(quality >= 0.88 and cost <= 0.95,
                  "on the held-out workload the router must keep >= 88% of the large model's quality "
                  "and cost at most 95% of sending everything to the large model",
                  threshold=t, small_share=round(float(small.mean()), 3), cost=round(float(cost), 3),
                  quality=round(float(quality), 3))
