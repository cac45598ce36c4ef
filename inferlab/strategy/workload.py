"""A seeded customer-service workload: one day of support chat, compressed into engine steps.

    arrivals   a Poisson process whose rate follows a daily profile (quiet night, a morning and an
               afternoon peak): ``peak_to_average`` is the busiest hour's rate over the day's mean
    prompts    one shared system prompt + a customer question: FAQ intents drawn by a Zipf law
               (a few questions are most of the traffic), each as a random paraphrase, plus near
               misses and out-of-scope questions from the course's question set
    outputs    answer lengths from a lognormal distribution, clipped

Every request is a dict: ``tick`` (arrival step), ``prompt``, ``question``, ``intent`` (None when
no cached answer is right), ``label`` (the intent the question really has, near misses included;
None when out of scope), ``topic``, ``max_tokens``.

The toy target continues text, so its prompt is ``SYSTEM_PROMPT`` + the question. A chat model
(smollm2) gets ``ChatPrompter``'s conversation instead: the shop's policies as the shared system
prompt, and in the user turn the FAQ entry nearest to the question (retrieval-augmented
generation, Lewis et al. 2020) before the question itself. The entry goes where the model reads
it: measured on smollm2 as stored (Q4_1; greedy, 48 tokens, 50 questions), the whole FAQ as a
1,084-token system prompt gave 7 grounded answers of 50 (fp32 too), the right entry in the user
turn 16-17.
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
                      near_miss_share: float = 0.15, out_of_scope_share: float = 0.05,
                      held_out: bool = False, conversations: int = 0) -> list[dict]:
    """``n_requests`` requests spread over one day of ``ticks`` engine steps (a seeded draw).
    ``held_out``: customers ask only the held-out half of the question set (``questions.halves``),
    never a question the cache's threshold was calibrated on nor one that seeds the cache.
    ``conversations``: that many of the question set's two-turn exchanges join the day (a chat
    model only), drawn apart so the single questions stay the same draw; each has ``turns`` (the
    two user messages, the second sent ``THINK_TICKS`` after the first reply) and ``question``, the
    second message, which decides the intent."""
    rng = np.random.default_rng(seed)
    data = Q.load()
    if held_out:
        keep = Q.held_out_questions(data)
        data = {**data, "out_of_scope": [q for q in data["out_of_scope"] if q in keep],
                "intents": [{**it, "questions": [q for q in it["questions"] if q in keep]} for it in data["intents"]]}
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
            question, intent, topic, label = str(rng.choice(data["out_of_scope"])), None, None, None
        elif u < out_of_scope_share + near_miss_share:
            it = misses[int(rng.integers(len(misses)))]
            question, intent, topic, label = str(rng.choice(it["questions"])), None, it["topic"], it["name"]
        else:
            it = cached[int(rng.choice(len(cached), p=popularity))]
            question, intent, topic, label = str(rng.choice(it["questions"])), it["name"], it["topic"], it["name"]
        length = rng.lognormal(math.log(mean_output) - sigma ** 2 / 2, sigma)
        out.append({"tick": int(tick), "prompt": SYSTEM_PROMPT + question, "question": question, "intent": intent,
                    "label": label, "topic": topic, "max_tokens": int(np.clip(round(length), min_output, max_output))})
    if conversations:
        talks = Q.conversations(data)
        if conversations > len(talks):
            raise ValueError(f"the question set has {len(talks)} two-turn conversations, not {conversations}")
        crng = np.random.default_rng(seed + 1)
        by_name = {it["name"]: it for it in data["intents"]}
        starts = np.sort(crng.choice(ticks, size=conversations, p=rate / rate.sum()))
        for tick, k in zip(starts, crng.permutation(len(talks))[:conversations]):
            c, it = talks[int(k)], by_name[talks[int(k)]["intent"]]
            out.append({"tick": int(tick), "prompt": SYSTEM_PROMPT + " ".join(c["turns"]), "question": c["turns"][1],
                        "turns": list(c["turns"]), "intent": it["name"] if it["cached"] else None,
                        "label": it["name"], "topic": it["topic"], "max_tokens": max_output})
        out.sort(key=lambda w: w["tick"])  # stable: a conversation goes after the questions of its tick
    return out


#: Ticks between a reply and the customer's next message in a two-turn conversation.
THINK_TICKS = 2


def faq(data: dict | None = None) -> list[dict]:
    """The FAQ a support team writes on day one: each cached intent's first question and its answer."""
    seeds, _ = Q.split(data)
    return seeds


#: The shared system prompt of the chat model: the shop's policies (what prefix caching shares).
POLICIES = ("You are the customer-service assistant of Northwind, a shop that sells phones, laptops and "
            "accessories, home internet (fibre and 5G routers) and a streaming subscription (basic and premium "
            "plans). Our policies: answer in one or two short sentences; use the FAQ entry the customer's message "
            "comes with, and do not invent prices, dates or menu names; never ask for a full card number or a "
            "password; orders can be returned within 30 days; support agents are available from 8:00 to 20:00 "
            "every day; if the question is not about our products, services or the customer's account, say that "
            "you can only help with the shop's services.")
#: The start of every answer, written into the assistant turn: it points the model at the entry.
ANSWER_START = "According to our FAQ,"


class ChatPrompter:
    """Chat prompts for a model with a chat template: ``POLICIES`` as the system turn; the user turn
    holds the FAQ entry whose question is nearest to the customer's (cosine similarity of
    ``embedder``'s sentence vectors over every intent's first question), then the question; the
    assistant turn starts with ``ANSWER_START``. ``ids(question)`` is the prompt's token ids and
    ``entry(question)`` the intent it retrieved."""

    def __init__(self, tokenizer, embedder, data: dict | None = None):
        from inferlab.model.chat import Chat

        data = data or Q.load()
        self.chat, self.tokenizer, self.embedder = Chat(tokenizer), tokenizer, embedder
        self.entries = [(it["name"], it["questions"][0], it["answer"]) for it in data["intents"]]
        self.keys = embedder.embed([q for _, q, _ in self.entries])
        self.start = tokenizer.encode(" " + ANSWER_START, add_special_tokens=False)

    def entry(self, question: str) -> tuple[str, str, str]:
        """(intent, FAQ question, FAQ answer) of the entry nearest to ``question``."""
        from inferlab.strategy.thresholds import nearest

        return self.entries[nearest(self.keys, self.embedder.embed([question])[0])[0]]

    def ids(self, question: str) -> list[int]:
        return self.parts(question)[0]

    def parts(self, question: str) -> tuple[list[int], int]:
        """The prompt's token ids, and where the customer's question starts in them (the router
        scores only the question: every prompt shares the rest)."""
        text, ids = self.chat.prompt([{"role": "system", "content": POLICIES},
                                      {"role": "user", "content": self._user_turn(question, question)}])
        start = len(self.tokenizer.encode(text[:text.rindex(question)].rstrip(), add_special_tokens=False))
        return ids + self.start, start

    def _user_turn(self, question: str, lookup: str) -> str:
        _, faq_q, faq_a = self.entry(lookup)
        return f"FAQ entry:\nQ: {faq_q}\nA: {faq_a}\n\nCustomer question: {question}"

    def follow_up(self, history: list[int], answer: list[int], question: str, lookup: str) -> tuple[list[int], int]:
        """The second turn of a conversation, as ``parts`` returns the first: ``history`` (the first
        turn's prompt ids) and ``answer`` (the reply's token ids) are kept token for token, so
        prefix caching serves the whole first exchange from the KV it already holds; then the
        template's end of that reply and the next user turn, whose FAQ entry is retrieved for
        ``lookup`` (what the customer has said so far: a follow-up rarely names its topic)."""
        mark = "\x00reply\x00"
        text, _ = self.chat.prompt([{"role": "system", "content": POLICIES}, {"role": "user", "content": "-"},
                                    {"role": "assistant", "content": mark},
                                    {"role": "user", "content": self._user_turn(question, lookup)}])
        suffix = text[text.index(mark) + len(mark):]
        end = self.chat.end_of_turn_id
        head = list(history) + list(answer[:-1] if answer and answer[-1] == end else answer)
        before = self.tokenizer.encode(suffix[:suffix.rindex(question)].rstrip(), add_special_tokens=False)
        return head + self.tokenizer.encode(suffix, add_special_tokens=False) + self.start, len(head) + len(before)

    def stop_ids(self) -> list[int]:
        return [t for t in (self.chat.end_of_turn_id,) if t is not None]

