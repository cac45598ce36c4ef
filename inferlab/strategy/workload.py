"""A seeded customer-service workload: one day of support chat, compressed into engine steps.

    arrivals   a Poisson process whose rate follows a daily profile (quiet night, a morning and an
               afternoon peak): ``peak_to_average`` is the busiest hour's rate over the day's mean
    prompts    one shared system prompt + a customer question: FAQ intents drawn by a Zipf law
               (a few questions are most of the traffic), each as a random paraphrase, plus near
               misses and out-of-scope questions from the course's question set
    outputs    answer lengths from a lognormal distribution, clipped

Every request is a dict: ``tick`` (arrival step), ``prompt``, ``question``, ``intent`` (None when
no cached answer is right), ``topic``, ``max_tokens``.
"""
from __future__ import annotations

import math

import numpy as np

from inferlab.strategy import questions as Q

SYSTEM_PROMPT = ("You are the support assistant of a shop that sells devices, home internet and a streaming "
                 "subscription. Answer in two sentences, politely, and only about our products and the "
                 "customer's account. If you are not sure, offer to connect a human agent.\n\nCustomer: ")


def daily_profile(hours: np.ndarray) -> np.ndarray:
    """Relative request rate over the day (mean 1): low at night, peaks at 11:00 and 16:00."""
    raw = 0.15 + np.exp(-((hours - 11) / 2.0) ** 2) + 0.8 * np.exp(-((hours - 16) / 2.5) ** 2)
    return raw / raw.mean()


def peak_to_average() -> float:
    h = np.linspace(0, 24, 24 * 60, endpoint=False)
    return float(daily_profile(h).max())


def customer_workload(n_requests: int = 64, ticks: int = 400, seed: int = 0, mean_output: float = 20,
                      min_output: int = 6, max_output: int = 40, zipf_s: float = 1.1,
                      near_miss_share: float = 0.15, out_of_scope_share: float = 0.05) -> list[dict]:
    """``n_requests`` requests spread over one day of ``ticks`` engine steps (a seeded draw)."""
    rng = np.random.default_rng(seed)
    data = Q.load()
    cached = [it for it in data["intents"] if it["cached"]]
    misses = [it for it in data["intents"] if not it["cached"]]
    popularity = 1 / np.arange(1, len(cached) + 1) ** zipf_s
    popularity /= popularity.sum()
    # arrival times: n draws from the daily profile (a Poisson process conditioned on its count)
    grid = np.linspace(0, 24, ticks, endpoint=False)
    rate = daily_profile(grid)
    when = np.sort(rng.choice(ticks, size=n_requests, p=rate / rate.sum()))
    sigma = 0.5
    out = []
    for tick in when:
        u = rng.random()
        if u < out_of_scope_share:
            question, intent, topic = str(rng.choice(data["out_of_scope"])), None, None
        elif u < out_of_scope_share + near_miss_share:
            it = misses[int(rng.integers(len(misses)))]
            question, intent, topic = str(rng.choice(it["questions"])), None, it["topic"]
        else:
            it = cached[int(rng.choice(len(cached), p=popularity))]
            question, intent, topic = str(rng.choice(it["questions"])), it["name"], it["topic"]
        length = rng.lognormal(math.log(mean_output) - sigma ** 2 / 2, sigma)
        out.append({"tick": int(tick), "prompt": SYSTEM_PROMPT + question, "question": question, "intent": intent,
                    "topic": topic, "max_tokens": int(np.clip(round(length), min_output, max_output))})
    return out


def faq(data: dict | None = None) -> list[dict]:
    """The FAQ a support team writes on day one: each cached intent's first question and its answer."""
    seeds, _ = Q.split(data)
    return seeds
