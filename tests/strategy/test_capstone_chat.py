"""The capstone on a real chat model (smollm2): retrieval-augmented chat prompts, answers read as
text, the three quality measures, the held-out workload and the priced bytes."""
import math

import numpy as np
import pytest
import torch

from inferlab.strategy import capstone as C, questions as Q
from inferlab.strategy.workload import ANSWER_START, POLICIES, customer_workload


def test_held_out_workload_asks_only_questions_no_threshold_saw():
    held = Q.held_out_questions()
    seeds, queries = Q.split()
    cal, _ = Q.halves(queries)
    assert held and held.isdisjoint({queries[i].text for i in cal}) and held.isdisjoint({s["question"] for s in seeds})
    work = customer_workload(60, ticks=300, seed=5, held_out=True)
    assert {w["question"] for w in work} <= held
    # every request keeps its true intent as its label: near misses have one, out-of-scope ones do not
    intents = {it["name"]: it for it in Q.load()["intents"]}
    for w in work:
        assert (w["label"] is None) == (w["topic"] is None)
        if w["label"] is not None:
            assert w["question"] in intents[w["label"]]["questions"]
            assert w["intent"] in (None, w["label"]) and (w["intent"] is None) == (not intents[w["label"]]["cached"])
    # the toy's default draw is unchanged by the new key
    assert [w["question"] for w in customer_workload(20, ticks=80, seed=1)] == \
           [w["question"] for w in customer_workload(20, ticks=80, seed=1, held_out=False)]


def test_step_bytes_prices_fp32_as_fp16_and_counts_a_tied_table_once():
    models = C.Models(device="cpu")
    fp32, _ = models.get("target", None)
    assert C.step_bytes(fp32) == 2 * fp32.num_parameters()
    int8, _ = models.get("target", "int8")
    assert C.step_bytes(int8) < 0.75 * C.step_bytes(fp32)


@pytest.fixture(scope="module")
def chat_models():
    from inferlab.strategy.embed import MiniLMEmbedder

    return C.Models(device="cpu", large="smollm2", small="smollm2_draft", embedder=MiniLMEmbedder())


@pytest.mark.slow
def test_answer_nll_scores_the_answer_tokens_only(chat_models):
    model, tok = chat_models.get("smollm2", "none")  # fp32: one row and many round alike
    prompt, answer = tok.encode("The capital of France is"), tok.encode(" Paris, of course.", add_special_tokens=False)
    total, n = C.answer_nll(model, prompt, answer)
    # the same sum, one next-token prediction at a time
    ids, want = list(prompt), 0.0
    with torch.inference_mode():
        for t in answer:
            logp = torch.log_softmax(model(torch.tensor([ids]))[0, -1].float(), -1)
            want -= float(logp[t])
            ids.append(t)
    assert n == len(answer) and total == pytest.approx(want, rel=1e-3)


@pytest.mark.slow
def test_chat_prompt_retrieves_the_entry_and_marks_the_question(chat_models):
    p = chat_models.prompter()
    assert p.entry("Please cancel my order, I changed my mind")[0] == "cancel_order"
    q = "I forgot my password, what do I do?"
    assert p.entry(q)[0] == "reset_password"
    ids, start = p.parts(q)
    tok = p.tokenizer
    text = tok.decode(ids, skip_special_tokens=False)
    assert POLICIES in text and "Forgot password" in text and text.endswith(ANSWER_START)
    assert tok.decode(ids[start:]).strip().startswith(q)


@pytest.mark.slow
def test_faq_requests_score_the_reference_answer_after_the_chat_prompt(chat_models, monkeypatch):
    """The router's chat requests: out-of-scope questions have no reference and are left out; each
    other question's continuation is its intent's FAQ answer, and its scores equal the capstone's
    own per-request NLLs (one forward each) although the shared system prompt runs once.
    Compared through the float reference of the quantized linears: the integer loops round every
    activation to int8, so the last-bit difference between attention over a cache and over the
    whole sequence flips a few codes and moves a 30-layer NLL by about 1%."""
    from inferlab.strategy import router as R

    monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "eager")

    p = chat_models.prompter()
    large, tok = chat_models.get("smollm2", None)
    small, _ = chat_models.get("smollm2_draft", None)
    _, queries = Q.split()
    picked = [q for q in queries if q.intent is None][:1] + [q for q in queries if q.intent is not None][::40]
    reqs = Q.faq_requests(p, picked)
    assert len(reqs) == len(picked) - 1
    answer = {it["name"]: it["answer"] for it in Q.load()["intents"]}
    for (ids, cont, start), q in zip(reqs, picked[1:]):
        assert (ids, start) == p.parts(q.text) and tok.decode(cont).strip() == answer[q.intent]
    assert R._shared_prefix(reqs) > len(tok.encode(POLICIES))   # the system turn, at least, runs once
    table = R.score_requests(small, large, reqs, batch_size=2)
    for i, (ids, cont, start) in enumerate(reqs):
        total, n = C.answer_nll(large, ids, cont)
        assert table["large_nll"][i] == pytest.approx(total / n, rel=1e-3)
        assert table["score"][i] == pytest.approx(C.prompt_nll(small, ids, start), rel=1e-3)
    # the capstone's batched reference scoring (a fresh Models: nothing memoised) gives the same sums
    fresh = C.Models(device="cpu", large="smollm2", small="smollm2_draft", embedder=p.embedder)
    got = fresh.reference_nlls("smollm2", None, [(ids, answer[q.intent]) for (ids, _, _), q in zip(reqs, picked[1:])])
    for (total, n), (ids, cont, _) in zip(got, reqs):
        want = C.answer_nll(large, ids, cont)
        assert n == want[1] and total == pytest.approx(want[0], rel=1e-3)


@pytest.mark.slow
def test_chat_deployment_serves_read_answers_with_three_quality_measures(chat_models):
    work = customer_workload(6, ticks=12, seed=2, held_out=True)
    base = C.serve({"quantization": None, "batching_policy": "continuous"}, work, chat_models)
    assert set(base["answers"]) == {f"r{i}" for i in range(len(work))}
    assert all(a.startswith(ANSWER_START) for a in base["answers"].values())
    labelled = [i for i, w in enumerate(work) if w["label"] is not None]
    assert base["grounded_requests"] == len(labelled)
    want = np.mean([Q.grounded(base["answers"][f"r{i}"], work[i]["label"]) for i in labelled])
    assert base["grounded"] == pytest.approx(want)
    assert base["grounded_by_request"] == {f"r{i}": Q.grounded(base["answers"][f"r{i}"], work[i]["label"]) for i in labelled}
    assert 1 < base["reference_ppl"] < 10 and all(len(t) <= C.CHAT_MAX_TOKENS for t in base["tokens"].values())
    # a cache at a threshold every question passes serves the FAQ's own answers; an answer is grounded exactly
    # when it is the answer of the question's own intent (a near miss served its neighbour's answer is not)
    answer_of = {it["name"]: it["answer"] for it in Q.load()["intents"]}
    many = customer_workload(40, ticks=80, seed=3, held_out=True)
    hit = C.serve({"batching_policy": "continuous", "semantic_cache_threshold": -1.0}, many, chat_models)
    assert hit["cache_hits"] == len(many) and set(hit["answers"].values()) <= set(answer_of.values())
    assert hit["engine_steps"] == 0 and 0 < hit["wrong_answers"] < len(many)
    right = [hit["answers"][f"r{i}"] == answer_of[w["label"]] for i, w in enumerate(many) if w["label"] is not None]
    assert hit["grounded"] == pytest.approx(np.mean(right)) and 0 < hit["grounded"] < 1
    # a router that sends everything to the small model: the reference answers are far less likely under it
    small = C.serve({"batching_policy": "continuous", "router_threshold": math.inf}, work, chat_models,
                    reference=base["tokens"])
    assert small["by"]["small"] == len(work) and small["reference_ppl"] > 2 * base["reference_ppl"]
    assert small["cost"] < base["cost"]


def test_conversations_join_the_day_without_changing_its_questions():
    plain = customer_workload(16, ticks=80, seed=0, held_out=True)
    both = customer_workload(16, ticks=80, seed=0, held_out=True, conversations=3)
    talks = [w for w in both if "turns" in w]
    assert [w for w in both if "turns" not in w] == plain and len(talks) == 3
    assert [w["tick"] for w in both] == sorted(w["tick"] for w in both)
    known = {tuple(c["turns"]): c["intent"] for c in Q.conversations()}
    assert all(known[tuple(w["turns"])] == w["label"] and w["question"] == w["turns"][1] for w in talks)
    with pytest.raises(ValueError, match="two-turn conversations"):
        customer_workload(16, conversations=99)
    with pytest.raises(ValueError, match="chat model"):
        C.serve({}, both, C.Models(device="cpu"))   # the toy continues text: it cannot hold a conversation


@pytest.mark.slow
def test_follow_up_keeps_the_first_exchange_token_for_token(chat_models):
    """The second turn's prompt is the first prompt and its reply, token for token (so prefix caching
    reuses their KV), then the template's next user turn: decoded, it is the conversation as the
    chat template renders it."""
    from inferlab.model.chat import Chat

    p = chat_models.prompter()
    tok = p.tokenizer
    first, second = "I need to send something back to you.", "It's the router I rented, my contract ended."
    history, _ = p.parts(first)
    reply = tok.encode(" you can return it within 30 days.", add_special_tokens=False) + p.stop_ids()
    ids, start = p.follow_up(history, reply, second, f"{first} {second}")
    assert ids[:len(history) + len(reply) - 1] == history + reply[:-1]
    assert p.entry(f"{first} {second}")[0] == "return_rental_router"
    user = lambda q, entry: f"FAQ entry:\nQ: {entry[1]}\nA: {entry[2]}\n\nCustomer question: {q}"  # noqa: E731
    text, _ = Chat(tok).prompt([{"role": "system", "content": POLICIES},
                                {"role": "user", "content": user(first, p.entry(first))},
                                {"role": "assistant", "content": f" {ANSWER_START} you can return it within 30 days."},
                                {"role": "user", "content": user(second, p.entry(f"{first} {second}"))}])
    assert tok.decode(ids, skip_special_tokens=False) == text + " " + ANSWER_START
    assert tok.decode(ids[start:]).strip().startswith(second)


@pytest.mark.slow
def test_a_conversation_is_served_turn_after_turn(chat_models):
    """Both turns are answered, the second THINK_TICKS after the first reply; a cache that serves
    everything answers both turns from the FAQ, wrongly here (the question set's conversations are
    all near misses: the cache holds only their neighbours' answers)."""
    from inferlab.strategy.workload import THINK_TICKS

    talk = [w for w in customer_workload(16, ticks=80, seed=0, held_out=True, conversations=1) if "turns" in w]
    talk[0]["tick"] = 0
    run = C.serve({"batching_policy": "continuous", "enable_prefix_caching": True}, talk, chat_models)
    assert run["requests"] == 2 and set(run["tokens"]) == {"r0a", "r0"} and set(run["grounded_by_request"]) == {"r0"}
    # the reply's last token at tick len - 1, the next turn THINK_TICKS later, its reply one token a tick
    assert run["ticks"] == len(run["tokens"]["r0a"]) - 1 + THINK_TICKS + len(run["tokens"]["r0"])
    # the second turn's prompt starts with the whole first exchange: its full blocks come from the prefix cache
    opening = len(chat_models.prompter().parts(talk[0]["turns"][0])[0]) + len(run["tokens"]["r0a"]) - 1
    assert run["prefix_hit_blocks"] == opening // C.BLOCK_SIZE
    p = chat_models.prompter()
    first = p.parts(talk[0]["turns"][0])[0]
    second = p.follow_up(first, run["tokens"]["r0a"], talk[0]["turns"][1], " ".join(talk[0]["turns"]))[0]
    assert run["prompt_tokens"] == len(first) + len(second)
    hit = C.serve({"batching_policy": "continuous", "semantic_cache_threshold": -1.0}, talk, chat_models)
    assert hit["cache_hits"] == 2 and hit["wrong_answers"] == 2 and hit["engine_steps"] == 0
    # each turn looks up what the customer has said so far, not its last message alone
    class Recording:
        def __init__(self, inner):
            self.inner, self.dim, self.texts = inner, inner.dim, []

        def embed(self, texts):
            self.texts += list(texts)
            return self.inner.embed(texts)

    seen = Recording(chat_models.embedder)
    C.serve({"batching_policy": "continuous", "semantic_cache_threshold": 1.0}, talk, chat_models, embedder=seen)
    turns = talk[0]["turns"]
    assert [t for t in seen.texts if turns[0] in t] == [turns[0], " ".join(turns)]
    assert hit["ticks"] == THINK_TICKS + 1
