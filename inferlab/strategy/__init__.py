"""Serving strategies: what a deployment does around the engine rather than inside it.

    semantic_cache.py  serve a stored answer to a request that means the same (embed, cosine, threshold)
    embed.py           the cache's embedders: wordllama (offline, 256 dims) and the model's hidden states
    questions.py       the customer-service question set and the cache's threshold sweep
    router.py          small or large model by a cheap signal; cost and quality over a threshold sweep
    priority.py        background precompute on the engine's priority scheduling, served from a cache
    thresholds.py      the cache lookup and the routing decision as plain functions, thresholds chosen on data (lab 07)
    workload.py        a seeded day of customer-service chat: Poisson arrivals, shared system prompt, FAQ questions
    capstone.py        serve that workload under a deployment (engine knobs + strategies) and measure it (lab 08)
    projection.py      Little's law and the roofline: from the measured workload to GPUs and cost per day
    views.py           notebook 07's live views and figures
"""
from inferlab.strategy.semantic_cache import CacheHit, SemanticCache

__all__ = ["CacheHit", "SemanticCache"]
