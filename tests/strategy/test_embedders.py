"""The semantic cache's embedders: MiniLM as sentence-transformers itself computes it, and the
calibrated threshold (one global threshold chosen for a precision bound on one split, checked
on the other)."""
import numpy as np
import pytest

from inferlab.strategy import questions
from inferlab.strategy.embed import MiniLMEmbedder, minilm_folder


@pytest.fixture(scope="module")
def minilm():
    return MiniLMEmbedder()


def test_minilm_matches_sentence_transformers(minilm):
    from sentence_transformers import SentenceTransformer

    texts = ["How do I reset my password?", "reset my router", "Where is my parcel? It was due on Monday and "
             "has still not arrived, the tracking page says nothing.", "ok"]
    ref = SentenceTransformer(str(minilm_folder()), device="cpu", local_files_only=True)
    want = ref.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    got = minilm.embed(texts)
    assert got.shape == (4, 384)
    np.testing.assert_allclose(got, want, atol=2e-5)
    # padding a short text beside long ones does not move it
    np.testing.assert_allclose(minilm.embed(["ok"])[0], got[3], atol=2e-5)


def test_calibrated_threshold_keeps_its_bound_on_the_calibration_split(minilm):
    r = questions.calibrated(minilm, min_precision=0.9)
    seeds, queries = questions.split()
    assert r["held_out"] == len(queries) // 2 and 0 < r["threshold"] < 1
    assert r["served_paraphrases"] + r["served_near_misses"] + r["served_out_of_scope"] == r["served"]
    assert r["served"] - r["right"] >= r["served_near_misses"] + r["served_out_of_scope"]  # those are always wrong
    assert r["paraphrases"] + r["near_misses"] + r["out_of_scope"] == r["held_out"]
    # at the chosen threshold the calibration split is served at >= 90% precision
    table = questions.nearest_table(minilm, seeds, queries)
    cal = np.arange(0, len(queries), 2)
    served = table["similarity"][cal] >= r["threshold"]
    right = np.array([p == t and t is not None for p, t in zip(table["intent"], table["truth"])])[cal]
    assert served.any() and right[served].mean() >= 0.9
