"""Log-probabilities (vLLM's ``logprobs`` / ``prompt_logprobs``) against transformers' log-softmax on
the same weights, under every engine knob: batching, n > 1, chunked prefill, prefix caching (a hit
is recomputed), preemption and speculation (the target's distribution, not the draft's); raw is the
default and processed is what the sampler drew from; nothing extra runs when no request asks."""
from __future__ import annotations

import math

import pytest
import torch

from inferlab.engine import llm_engine
from inferlab.model.loader import ASSETS
from inferlab.logprobs import Logprob
from inferlab.sampling import RequestOutputKind, SamplingParams, filter_logits

from .conftest import make_engine, run_all

TOL = 1e-4
HEAD = "import os\n\n\nclass Path:\n    def __init__(self, path):\n        self.path = path\n\n"
PROMPTS = ["def fib(n):\n", HEAD + "    def", "for i in range(10):\n    print(i", HEAD + "    def __repr__(self"]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
DRAFT = {"model": "draft", "num_speculative_tokens": 3}
MEDUSA = {"method": "medusa", "num_speculative_tokens": 3, "model": str(ASSETS / "target_medusa")}
# chunked prefill (a 24-token budget splits the long prompts), shared heads, a pool too small for all
EVERY_KNOB = dict(block_size=8, num_kv_blocks=16, max_num_batched_tokens=24, max_num_seqs=6,
                  enable_chunked_prefill=True, enable_prefix_caching=True)


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(str(ASSETS / "target"), dtype=torch.float32).eval()


def reference(hf, ids: list[int]) -> torch.Tensor:
    """transformers' log-softmax [len(ids), V] over ``ids``: row t scores token t + 1."""
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def run(target, prompts, params, **knobs):
    engine = make_engine(target, **knobs)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params if isinstance(params, SamplingParams) else params[i])
    finals = run_all(engine)
    return [finals[str(i)] for i in range(len(prompts))], engine


def check_sample(ref: torch.Tensor, prompt_len: int, comp, n: int) -> float:
    """Each generated token's entry against the reference; returns the largest difference."""
    assert len(comp.logprobs) == len(comp.token_ids)
    worst, total = 0.0, 0.0
    for i, (tok, entry) in enumerate(zip(comp.token_ids, comp.logprobs)):
        row = ref[prompt_len - 1 + i]
        worst = max(worst, check_entry(row, tok, entry, n))
        total += entry[tok].logprob
    assert comp.cumulative_logprob == pytest.approx(total, abs=1e-9)
    return worst


def check_entry(row: torch.Tensor, tok: int, entry: dict, n: int) -> float:
    """The chosen token first with its log-prob and rank, then the n best (by value: ties may order
    either way); returns the largest difference from ``row``."""
    assert next(iter(entry)) == tok and all(isinstance(v, Logprob) for v in entry.values())
    assert all(v.decoded_token is not None for v in entry.values())
    worst = max(abs(v.logprob - float(row[t])) for t, v in entry.items())
    rank = entry[tok].rank
    assert int((row > row[tok] + TOL).sum()) + 1 <= rank <= int((row > row[tok] - TOL).sum()) + 1
    top = [v for t, v in entry.items() if t != tok] + ([entry[tok]] if rank <= n else [])
    assert len(top) == n
    got = sorted((v.logprob for v in top), reverse=True)
    assert max(abs(a - b) for a, b in zip(got, row.topk(n).values.tolist())) <= TOL if n else True
    return worst


def check_prompt(ref: torch.Tensor, ids: list[int], prompt_logprobs, n: int) -> float:
    assert prompt_logprobs[0] is None and len(prompt_logprobs) == len(ids)
    return max(check_entry(ref[t - 1], ids[t], prompt_logprobs[t], n) for t in range(1, len(ids)))


def test_logprobs_and_prompt_logprobs_match_transformers(target, hf):
    """A batch of four, greedy: every generated and prompt token within 1e-4 of transformers."""
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=5, prompt_logprobs=3, ignore_eos=True)
    outs, _ = run(target, PROMPTS, params)
    worst = 0.0
    for out in outs:
        ids = out.prompt_token_ids
        comp = out.outputs[0]
        ref = reference(hf, ids + comp.token_ids)
        worst = max(worst, check_sample(ref, len(ids), comp, 5), check_prompt(ref, ids, out.prompt_logprobs, 3))
        assert all(len(e) in (5, 6) for e in comp.logprobs)  # the chosen token plus the 5 best
    print(f"max |logprob - transformers| = {worst:.2e}")
    assert worst <= TOL


@pytest.mark.parametrize("spec", [None, NGRAM, DRAFT, MEDUSA], ids=["plain", "ngram", "draft", "medusa"])
def test_every_knob_and_speculation(target, hf, spec):
    """Chunked prefill, prefix caching, preemption and n = 2 sampled at temperature 0.8, with and
    without speculation: each token's log-prob is the target's, at its position, within 1e-4
    (Medusa reads the hidden states of the same rows: the prompt rows come after them)."""
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=24, ignore_eos=True, logprobs=2,
                             prompt_logprobs=1, n=2 if i % 2 else 1) for i in range(len(PROMPTS))]
    outs, engine = run(target, PROMPTS, params, speculative_config=spec, **EVERY_KNOB)
    assert engine.num_preemptions > 0
    if spec is not None:
        assert engine.counters["spec_decode_num_accepted_tokens"] > 0
    worst = 0.0
    for out in outs:
        ids = out.prompt_token_ids
        worst = max(worst, check_prompt(reference(hf, ids), ids, out.prompt_logprobs, 1))
        for comp in out.outputs:
            worst = max(worst, check_sample(reference(hf, ids + comp.token_ids), len(ids), comp, 2))
    assert worst <= TOL


def test_prefix_cache_hit_is_recomputed_for_prompt_logprobs(target, hf):
    """A cached prompt has no logits: a request that wants prompt log-probs computes it again and
    gets every one; a request that does not still hits the cache."""
    prompt = HEAD * 2 + "    def"
    engine = make_engine(target, block_size=8, enable_prefix_caching=True)
    engine.add_request("warm", prompt, SamplingParams(temperature=0, max_tokens=2))
    run_all(engine)
    hits = engine.block_manager.prefix_hits
    engine.add_request("scored", prompt, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2))
    out = run_all(engine)["scored"]
    assert engine.block_manager.prefix_hits == hits  # no hit: the prompt's rows were computed
    ids = out.prompt_token_ids
    assert check_prompt(reference(hf, ids), ids, out.prompt_logprobs, 2) <= TOL
    engine.add_request("plain", prompt, SamplingParams(temperature=0, max_tokens=2))
    run_all(engine)
    assert engine.block_manager.prefix_hits > hits


def test_raw_is_the_default_and_processed_is_what_was_sampled(target, hf):
    """vLLM's default ``logprobs_mode="raw_logprobs"``: the model's own distribution, whatever the
    temperature and top-k. ``"processed_logprobs"``: after them (outside the top-k: -inf)."""
    params = SamplingParams(temperature=0.5, top_k=3, seed=0, max_tokens=8, logprobs=4, ignore_eos=True)
    (raw,), _ = run(target, PROMPTS[:1], params)
    (processed,), _ = run(target, PROMPTS[:1], params, logprobs_mode="processed_logprobs")
    ids, a, b = raw.prompt_token_ids, raw.outputs[0], processed.outputs[0]
    assert a.token_ids == b.token_ids  # the same draws: the mode changes what is reported only
    ref = reference(hf, ids + a.token_ids)
    assert check_sample(ref, len(ids), a, 4) <= TOL
    with torch.no_grad():
        logits = hf(torch.tensor([ids + a.token_ids])).logits[0]
    for i, (tok, entry) in enumerate(zip(b.token_ids, b.logprobs)):
        want = filter_logits(logits[len(ids) - 1 + i], 0.5, 3, 1.0).log_softmax(-1)
        assert abs(entry[tok].logprob - float(want[tok])) <= TOL and entry[tok].rank <= 3
        kept = [v.logprob for v in entry.values() if v.logprob > -math.inf]
        assert len(kept) == 3 and sum(math.exp(x) for x in kept) == pytest.approx(1, abs=1e-5)
        assert sum(v.logprob == -math.inf for v in entry.values()) == 1  # the 4th best is filtered out


def test_delta_outputs_carry_only_the_new_logprobs(target):
    engine = make_engine(target)
    engine.add_request("d", PROMPTS[0], SamplingParams(temperature=0, max_tokens=6, logprobs=1,
                                                       output_kind=RequestOutputKind.DELTA))
    steps = []
    while engine.has_unfinished_requests():
        steps += [o.outputs[0] for o in engine.step()]
    assert all(len(c.logprobs) == len(c.token_ids) for c in steps)
    assert steps[-1].cumulative_logprob == pytest.approx(sum(e[t].logprob for c in steps
                                                             for t, e in zip(c.token_ids, c.logprobs)))


def test_nothing_extra_runs_when_no_request_asks(target, monkeypatch):
    """No prompt rows, no log-softmax, the lm_head on the sampling rows only; outputs carry None."""
    def refuse(*args, **kwargs):
        raise AssertionError("a log-softmax ran though no request asked")

    monkeypatch.setattr(llm_engine, "log_probs", refuse)
    model, _ = target
    head_rows = []
    handle = model.lm_head.register_forward_hook(lambda m, args, out: head_rows.append(args[0].shape[1]))
    try:
        outs, engine = run(target, PROMPTS, SamplingParams(temperature=0, max_tokens=4, n=2), **EVERY_KNOB)
    finally:
        handle.remove()
    steps = engine.counters["num_steps"]
    assert len(head_rows) == steps and sum(head_rows) <= steps * EVERY_KNOB["max_num_seqs"]
    assert all(o.prompt_logprobs is None and c.logprobs is None and c.cumulative_logprob is None
               for o in outs for c in o.outputs)


def test_bad_logprobs_are_one_line_errors(target):
    with pytest.raises(ValueError, match="logprobs must be None"):
        SamplingParams(logprobs=-1)
    with pytest.raises(ValueError, match="prompt_logprobs must be None"):
        SamplingParams(prompt_logprobs=1.5)
    engine = make_engine(target)
    with pytest.raises(ValueError, match="logprobs=21 exceeds max_logprobs=20"):
        engine.add_request("x", "a", SamplingParams(logprobs=21))
    with pytest.raises(ValueError, match="unknown logprobs_mode"):
        make_engine(target, logprobs_mode="logits")


@pytest.mark.slow
def test_smollm2_logprobs_match_transformers(smollm2_fp32, smollm2_transformers):
    """The real model, one short prompt: prompt and generated log-probs within 1e-4."""
    from inferlab.llm import LLM

    model, tok = smollm2_fp32
    hf_model, _ = smollm2_transformers
    ids = tok.encode("The capital of France is")
    out = LLM.from_model(model, tok).generate(prompt_token_ids=[ids], sampling_params=SamplingParams(
        temperature=0, max_tokens=4, logprobs=3, prompt_logprobs=3))[0]
    ref = reference(hf_model, ids + out.outputs[0].token_ids)
    worst = max(check_sample(ref, len(ids), out.outputs[0], 3), check_prompt(ref, ids, out.prompt_logprobs, 3))
    print(f"smollm2: max |logprob - transformers| = {worst:.2e}")
    assert worst <= TOL
