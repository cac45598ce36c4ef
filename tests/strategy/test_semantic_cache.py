"""The semantic cache: nearest neighbour, threshold, scope, verify, LRU and TTL eviction; and the
customer-service sweep with the real wordllama embedder."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from inferlab.strategy import questions
from inferlab.strategy.embed import normalize
from inferlab.strategy.semantic_cache import SemanticCache


class TableEmbedder:
    """Vectors looked up by text: the cache's logic without a model."""
    dim = 3

    def __init__(self, table):
        self.table = {k: normalize(np.array(v, dtype=np.float32)) for k, v in table.items()}

    def embed(self, texts):
        return np.stack([self.table[t] for t in texts])


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


E = TableEmbedder({"a": [1, 0, 0], "a'": [0.95, 0.31, 0], "b": [0, 1, 0], "c": [0, 0, 1], "ab": [1, 1, 0]})


def test_the_cache_searches_with_the_function_it_is_given():
    """Lab 07's nearest plugs into the capstone's cache: the cache asks it about the live rows only
    (here one scope's) and maps its row back to the cache's slot."""
    calls = []

    def last_row(keys, query):  # a deliberately different search: the last live row, similarity 1
        calls.append(len(keys))
        return (len(keys) - 1, 1.0) if len(keys) else (-1, float("-inf"))

    cache = SemanticCache(E, threshold=0.9, capacity=8, nearest=last_row)
    for q, scope in (("a", "x"), ("b", "y"), ("c", "x"), ("ab", "y")):
        cache.insert(q, f"answer {q}", scope=scope)
    assert cache.lookup("a", scope="x").answer == "answer c"   # the reference would find "a"
    assert cache.lookup("b", scope="y").answer == "answer ab"
    assert calls == [2, 2]
    assert cache.lookup("a", scope="z") is None and calls[-1] == 0


def test_threshold_decides_hit_or_miss():
    cache = SemanticCache(E, threshold=0.9)
    cache.insert("a", "answer a")
    hit = cache.lookup("a'")
    assert hit is not None and hit.answer == "answer a" and hit.query == "a"
    assert hit.similarity == pytest.approx(0.95 / np.hypot(0.95, 0.31), abs=1e-6)
    assert cache.lookup("ab") is None            # cos 0.707 < 0.9
    cache.threshold = 0.7
    assert cache.lookup("ab").answer == "answer a"
    assert cache.stats["hits"] == 2 and cache.stats["misses"] == 1


def test_a_similarity_equal_to_the_threshold_is_served():
    cache = SemanticCache(E, threshold=1.0)  # the same text: cosine exactly 1
    cache.insert("a", "answer a")
    assert cache.lookup("a").answer == "answer a" and cache.lookup("a'") is None


def test_nearest_picks_the_most_similar_not_the_first():
    cache = SemanticCache(E, threshold=0.5)
    cache.insert("b", "answer b")
    cache.insert("a", "answer a")
    assert cache.lookup("a'").answer == "answer a"


def test_scope_keeps_other_topics_out():
    cache = SemanticCache(E, threshold=0.5)
    cache.insert("a", "answer a", scope="account")
    assert cache.lookup("a'", scope="internet") is None
    assert cache.lookup("a'", scope="account").answer == "answer a"
    assert cache.lookup("a'").answer == "answer a"   # no scope given: every entry competes


def test_verify_can_reject_the_candidate():
    cache = SemanticCache(E, threshold=0.5, verify=lambda q, cached: q == cached)
    cache.insert("a", "answer a")
    assert cache.lookup("a'") is None and cache.stats["rejected_by_verify"] == 1
    assert cache.lookup("a").answer == "answer a"


def test_full_cache_evicts_the_least_recently_used():
    clock = Clock()
    cache = SemanticCache(E, threshold=0.99, capacity=2, clock=clock)
    cache.insert("a", "A")
    clock.t = 1
    cache.insert("b", "B")
    clock.t = 2
    assert cache.lookup("a").answer == "A"       # a is now the most recently used
    clock.t = 3
    cache.insert("c", "C")                        # evicts b, not a (a is older but was used)
    assert len(cache) == 2 and cache.stats["evicted_lru"] == 1
    assert cache.lookup("b") is None
    assert cache.lookup("a").answer == "A" and cache.lookup("c").answer == "C"


def test_entries_expire_after_their_ttl():
    clock = Clock()
    cache = SemanticCache(E, threshold=0.99, ttl_s=10, clock=clock)
    cache.insert("a", "A")
    clock.t = 9.9
    assert cache.lookup("a").answer == "A"        # use does not extend the life of an answer
    clock.t = 10
    assert cache.lookup("a") is None and len(cache) == 0 and cache.stats["expired"] == 1
    slot = cache.insert("b", "B")                 # the expired slot is reused before any eviction
    assert slot == 0 and cache.stats["evicted_lru"] == 0


@pytest.mark.parametrize("kwargs, words", [(dict(threshold=1.5), "threshold"), (dict(capacity=0), "capacity"),
                                           (dict(ttl_s=0), "ttl_s")])
def test_bad_settings_say_what_to_do(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SemanticCache(E, **kwargs)


class ArrayEmbedder:
    def __init__(self, dim):
        self.dim = dim


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(0, 10_000), st.integers(1, 50))
def test_nearest_matches_a_plain_loop(n, seed, capacity):
    """Brute force over the live slots (capacity may be smaller than what was inserted) against
    a python loop over the entries that should remain."""
    rng = np.random.default_rng(seed)
    vecs = normalize(rng.normal(size=(n, 8)))
    clock = Clock()
    cache = SemanticCache(ArrayEmbedder(8), threshold=-1, capacity=capacity, clock=clock)
    for i, v in enumerate(vecs):
        clock.t = i
        cache.insert(f"q{i}", f"a{i}", embedding=v)
    live = list(range(max(0, n - capacity), n))   # no lookups: eviction is oldest first
    q = normalize(rng.normal(size=8))
    best = max(live, key=lambda i: float(sum(float(x) * float(y) for x, y in zip(vecs[i], q))))
    hit = cache.lookup("q", embedding=q)
    assert hit.answer == f"a{best}"


# ---------------------------------------------------------------- the real embedder on the question set

@pytest.fixture(scope="module")
def wordllama():
    from inferlab.strategy.embed import WordLlamaEmbedder
    return WordLlamaEmbedder()


def test_question_set_is_well_formed():
    data = questions.load()
    names = {it["name"] for it in data["intents"]}
    for it in data["intents"]:
        assert len(it["questions"]) >= 6 and it["answer"] and it["topic"]
        if "near_miss_of" in it:
            assert not it["cached"] and it["near_miss_of"] in names
    seeds, queries = questions.split(data)
    assert len(seeds) == sum(it["cached"] for it in data["intents"])
    assert {q.text for q in queries}.isdisjoint(s["question"] for s in seeds)


def test_wordllama_puts_paraphrases_close_and_near_misses_closer_than_it_should(wordllama):
    e = wordllama.embed(["How do I reset my password?", "I forgot my password, what do I do?",
                         "How do I reset my router?", "What is the capital of Australia?"])
    assert np.allclose(np.linalg.norm(e, axis=1), 1, atol=1e-5) and e.shape == (4, 256)
    sim = e @ e.T
    assert sim[0, 1] > sim[0, 3] + 0.3           # a paraphrase is far closer than an unrelated question
    assert sim[0, 2] > sim[0, 1] - 0.3            # the near miss is about as close as the paraphrase: the trap


def test_sweep_trades_hits_for_precision_and_scope_removes_wrong_answers(wordllama):
    seeds, queries = questions.split()
    ths = [0.3, 0.5, 0.7]
    plain = questions.sweep(questions.nearest_table(wordllama, seeds, queries), ths)
    scoped = questions.sweep(questions.nearest_table(wordllama, seeds, queries, scoped=True), ths)
    hit = [r["hit_rate"] for r in plain]
    assert hit == sorted(hit, reverse=True) and hit[0] > 0.5
    assert plain[0]["precision"] < 0.75           # a low threshold serves many wrong answers
    assert plain[-1]["precision"] > plain[0]["precision"] + 0.2
    for p, s in zip(plain, scoped):
        assert s["wrong"] < p["wrong"]            # scoping by topic removes wrong answers...
        assert s["recall"] >= p["recall"] - 0.02  # ...and (almost) no right ones
    r = plain[1]
    assert r["served"] == r["right"] + r["wrong"] and 0 <= r["recall"] <= 1
    saved = questions.sweep(questions.nearest_table(wordllama, seeds, queries), [0.5], generate_s=1.0, lookup_s=0.01)
    assert saved[0]["latency_saved_s"] == pytest.approx(saved[0]["hit_rate"] - 0.01)
