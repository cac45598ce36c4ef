"""Speculative decoding as a mode of the engine's step (n-gram prompt lookup): greedy outputs equal
plain decoding under every engine knob, rejected guesses roll back to a cache equal to a clean
run's, stops land where plain decoding puts them, seeded sampling is reproducible, the counters
add up, and bad configs fail with one line."""
from __future__ import annotations

import pytest
import torch

from inferlab.engine.config import EngineConfig
from inferlab.engine.llm_engine import LLMEngine
from inferlab.engine.model_runner import SeqInput
from inferlab.errors import InferlabError
from inferlab.sampling import SamplingParams
from inferlab.spec.config import MAX_SPECULATIVE_TOKENS, SpeculativeConfig

from .conftest import make_engine, run_all, same_greedy

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
HEAD = "import os\n\n\nclass Path:\n    def __init__(self, path):\n        self.path = path\n\n"
PROMPTS = ["def fib(n):\n", HEAD + "    def", "for i in range(10):\n    print(i", HEAD + "    def __repr__(self",
           "x = 1\n", HEAD + "    @property\n    def name(self):\n        return self.path.name\n\n    def"]


def run(pair, prompts, params, **knobs):
    engine = make_engine(pair, **knobs)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params if isinstance(params, SamplingParams) else params[i])
    finals = run_all(engine)
    return [finals[str(i)].outputs[0] for i in range(len(prompts))], engine


DRAFT = {"model": "draft", "num_speculative_tokens": 3}


def assert_within_target_top_k(target, prompts, outs, k: int) -> None:
    """Every emitted token is one of the target's ``k`` best at its position, given the tokens
    before it (a kept guess the target would never sample falls outside)."""
    model, tok = target
    for prompt, out in zip(prompts, outs):
        ids = tok.encode(prompt)
        with torch.inference_mode():
            logits = model(torch.tensor([ids + out.token_ids]))[0, len(ids) - 1:-1]
        top = logits.topk(k, -1).indices
        assert all(t in row for t, row in zip(out.token_ids, top.tolist()))


@pytest.mark.parametrize("spec_config", [NGRAM, DRAFT, "eagle"], ids=["ngram", "draft", "eagle"])
def test_greedy_equals_plain_under_every_knob(target, spec_config, request):
    """Mixed prompt lengths, chunked prefill (a 24-token budget splits the long prompts), prefix
    caching (shared heads) and preemption (a pool too small for all six): same tokens as plain."""
    if spec_config == "eagle":
        spec_config = request.getfixturevalue("eagle_config")
    model, tok = target
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    knobs = dict(block_size=8, num_kv_blocks=16, max_num_batched_tokens=24, max_num_seqs=6,
                 enable_chunked_prefill=True, enable_prefix_caching=True)
    want, plain = run(target, PROMPTS, params, **knobs)
    got, spec = run(target, PROMPTS, params, speculative_config=spec_config, **knobs)
    for p, g, w in zip(PROMPTS, got, want):
        assert same_greedy(model, tok.encode(p), g.token_ids, w.token_ids)
    c = spec.counters
    assert spec.num_preemptions > 0 and spec.block_manager.prefix_hits > 0
    assert 0 < c["spec_decode_num_accepted_tokens"] < c["spec_decode_num_draft_tokens"]  # kept some, rejected some
    assert c["num_generation_tokens"] == plain.counters["num_generation_tokens"] == 40 * len(PROMPTS)
    assert c["num_steps"] < plain.counters["num_steps"]


@pytest.mark.parametrize("spec_config", [{"method": "ngram", "num_speculative_tokens": 5},
                                         {"model": "draft", "num_speculative_tokens": 4}], ids=["ngram", "draft"])
def test_rollback_leaves_the_cache_of_a_clean_run(target, spec_config):
    """After every step, each running sequence holds exactly its computed tokens (rejected slots
    given back, blocks left empty freed), and the K/V of all its computed positions equals a
    plain prefill of those tokens, in every layer (the draft model's cache too)."""
    model, tok = target
    engine = make_engine(target, block_size=4, num_kv_blocks=64, enable_prefix_caching=True,
                         speculative_config=spec_config)
    for i, p in enumerate(PROMPTS[:3]):
        engine.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))
    bm, bs, checked = engine.block_manager, engine.config.block_size, 0
    while engine.has_unfinished_requests():
        before = engine.counters["spec_decode_num_draft_tokens"] - engine.counters["spec_decode_num_accepted_tokens"]
        engine.step()
        rejected = engine.counters["spec_decode_num_draft_tokens"] - engine.counters["spec_decode_num_accepted_tokens"]
        for seq in engine.scheduler.running:
            n = seq.num_computed_tokens
            assert bm.num_tokens(seq.seq_id) == n and len(bm.block_table(seq.seq_id)) == -(-n // bs)
            table, named = bm.block_table(seq.seq_id), bm.num_cached_tokens(seq.seq_id)
            assert n - named < bs  # every block full of kept tokens is named
            for i in range(named // bs):  # what prefix caching named: the kept tokens, never a guess
                block = bm.blocks[table[i]]  # (unnamed if an equal block was named first)
                assert block.hash is None or block.token_ids == tuple(seq.token_ids(i * bs, (i + 1) * bs))
            if rejected > before and seq.is_decoding:  # a rollback just happened: compare with a clean run
                assert_cache_equals_clean_run(engine, seq, target)
                checked += 1
    assert checked >= 3


def assert_cache_equals_clean_run(engine, seq, pair):
    n = seq.num_computed_tokens
    clean = make_engine(pair, block_size=4, num_kv_blocks=64)
    clean.add_request("clean", seq.token_ids(0, n), SamplingParams(temperature=0, max_tokens=2))
    clean.step()
    (cseq,) = clean.scheduler.running
    table = torch.tensor(engine.block_manager.block_table(seq.seq_id))
    ctable = torch.tensor(clean.block_manager.block_table(cseq.seq_id))
    for layer in range(model_layers(engine)):
        k, v = engine.kv_cache.gather(layer, table, n)
        ck, cv = clean.kv_cache.gather(layer, ctable, n)
        torch.testing.assert_close(k, ck, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(v, cv, atol=1e-4, rtol=1e-4)
    from inferlab.engine.draft import DraftProposer

    if isinstance(engine.proposer, DraftProposer):  # the draft's K/V of the tokens it saw: a clean draft prefill's
        drafted = engine.proposer.num_computed[seq.seq_id]
        seen = min(drafted, n)
        draft = engine.proposer.model
        clean_draft = DraftProposer(draft, engine.model, 64, 4)
        clean_draft.runner.execute([SeqInput(seq.token_ids(0, seen), 0, ctable.tolist())])
        for layer in range(draft.config.num_hidden_layers):
            k, v = engine.proposer.kv_cache.gather(layer, table, seen)
            ck, cv = clean_draft.kv_cache.gather(layer, ctable, seen)
            torch.testing.assert_close(k, ck, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(v, cv, atol=1e-4, rtol=1e-4)
        # the draft saw every kept token but at most the last kept guess (it feeds that one next step)
        assert n - 1 <= drafted, (drafted, n)


def model_layers(engine) -> int:
    return engine.model.config.num_hidden_layers


def test_stops_partway_where_plain_decoding_stops(target):
    """A stop token, a stop string and max_tokens met inside a run of accepted guesses."""
    model, tok = target
    base = SamplingParams(temperature=0, max_tokens=60)
    (free,), _ = run(target, [PROMPTS[1]], base)
    stops = [SamplingParams(temperature=0, max_tokens=60, stop_token_ids=[free.token_ids[9]]),
             SamplingParams(temperature=0, max_tokens=60, stop=[tok.decode(free.token_ids[12:14])]),
             SamplingParams(temperature=0, max_tokens=11, ignore_eos=True)]
    for params in stops:
        (want,), _ = run(target, [PROMPTS[1]], params)
        (got,), engine = run(target, [PROMPTS[1]], params, speculative_config=NGRAM)
        assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
        assert engine.counters["spec_decode_num_accepted_tokens"] > 0


def test_seeded_sampling_is_reproducible(target):
    params = [SamplingParams(temperature=0.8, top_p=0.9, max_tokens=30, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    runs = [run(target, PROMPTS[:3], params, speculative_config=NGRAM) for _ in range(2)]
    assert [o.token_ids for o in runs[0][0]] == [o.token_ids for o in runs[1][0]]
    assert runs[0][1].counters["spec_decode_num_accepted_tokens"] > 0
    other = [SamplingParams(**{**p.__dict__, "seed": p.seed + 10}) for p in params]
    assert [o.token_ids for o in run(target, PROMPTS[:3], other, speculative_config=NGRAM)[0]] != \
        [o.token_ids for o in runs[0][0]]


def test_sampled_tokens_stay_inside_the_requests_distribution(target):
    """Top-k 3 at temperature 1: whatever the guesses were, every emitted token is one of the
    target's 3 best at its position (a kept rejected guess would fall outside)."""
    params = SamplingParams(temperature=1.0, top_k=3, max_tokens=40, seed=0, ignore_eos=True)
    outs, engine = run(target, PROMPTS[:3], params, speculative_config={"method": "ngram", "num_speculative_tokens": 5})
    c = engine.counters
    assert 0 < c["spec_decode_num_accepted_tokens"] < c["spec_decode_num_draft_tokens"]
    assert_within_target_top_k(target, PROMPTS, outs, 3)


def test_guesses_never_starve_a_running_sequence(target):
    """A budget of one token per sequence leaves no room for guesses: every step still decodes
    every running sequence, and the output is plain decoding's."""
    model, tok = target
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    prompts = [PROMPTS[4], PROMPTS[0], PROMPTS[2]]
    knobs = dict(max_num_seqs=3, max_num_batched_tokens=4, enable_chunked_prefill=True)
    want, _ = run(target, prompts, params, **knobs)
    engine = make_engine(target, speculative_config=NGRAM, **knobs)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    finals = {}
    while engine.has_unfinished_requests():
        decoding = [(s, len(s.output_token_ids)) for s in engine.scheduler.running if s.is_decoding]
        for out in engine.step():
            finals[out.request_id] = out
        assert all(len(s.output_token_ids) > n for s, n in decoding)  # each one decoded this step
    assert [finals[str(i)].outputs[0].token_ids for i in range(3)] == [w.token_ids for w in want]
    assert engine.counters["spec_decode_num_drafts"] > 0  # a sequence alone got guesses


def test_budget_left_over_goes_to_guesses_oldest_first(target):
    engine = make_engine(target, max_num_seqs=4, max_num_batched_tokens=8, enable_chunked_prefill=True,
                         speculative_config=NGRAM)
    for i, p in enumerate(PROMPTS[:3]):
        engine.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    while len(engine.scheduler.running) < 3 or not all(s.is_decoding for s in engine.scheduler.running):
        engine.step()  # the prefills, in chunks
    for seq in engine.scheduler.running:
        seq.spec_token_ids = [1, 2, 3]
    engine.scheduler.fit_spec_tokens()  # 8 tokens - 3 owed = 5 for guesses
    assert [len(s.spec_token_ids) for s in engine.scheduler.running] == [3, 2, 0]


def test_a_step_keeps_only_the_guesses_it_scheduled(target):
    """Guesses live on the sequence alone: scheduling 1 + 2 of a decode's 1 + 4 tokens leaves it
    the first 2 guesses, which are what the step verifies (rows 1 + 2, not 1 + 4)."""
    from inferlab.engine.sched_output import SchedulerOutput
    engine = make_engine(target, speculative_config=NGRAM)
    engine.add_request("0", PROMPTS[0], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    while not engine.scheduler.running or not engine.scheduler.running[0].is_decoding:
        engine.step()
    (seq,) = engine.scheduler.running
    seq.spec_token_ids = [5, 6, 7, 8]
    out = SchedulerOutput()
    out.add(seq, 3)
    (s,) = out.scheduled
    assert (s.num_spec_tokens, s.num_committed, s.spec_token_ids) == (2, 1, [5, 6])
    assert seq.spec_token_ids == [5, 6]


@pytest.mark.parametrize("bad, words", [
    ({"method": "medusa2", "num_speculative_tokens": 3}, "unknown speculative method"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be"),
    ({"method": "ngram", "num_speculative_tokens": MAX_SPECULATIVE_TOKENS + 1}, "num_speculative_tokens must be"),
    ({"method": "ngram"}, "needs num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 0}, "prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "lookup": 3}, "unknown speculative_config keys"),
    ({"method": "draft", "num_speculative_tokens": 4}, "needs a model"),
    ({"method": "ngram", "model": "draft", "num_speculative_tokens": 4}, "uses no model"),
    ({"model": "draft", "num_speculative_tokens": 4, "confidence_threshold": 1.0}, "confidence_threshold must be"),
    ({"method": "eagle", "num_speculative_tokens": 4, "confidence_threshold": "0.3"}, "confidence_threshold must be"),
    ({"method": "medusa", "num_speculative_tokens": 4, "confidence_threshold": -0.1}, "confidence_threshold must be"),
    ({"method": "ngram", "num_speculative_tokens": 4, "confidence_threshold": 0.3}, "unknown speculative_config keys"),
    ("ngram", "must be a dict"),
])
def test_bad_speculative_config_fails_in_one_line(target, bad, words):
    model, _ = target
    with pytest.raises(ValueError, match=words) as e:
        EngineConfig(speculative_config=bad).resolve(model.config, model.dtype, model.device)
    assert "\n" not in str(e.value)


def test_draft_with_another_vocabulary_is_refused(target, tmp_path):
    from core.checkpoints import save_variant

    save_variant("llama_gqa", tmp_path)
    with pytest.raises(ValueError, match="the draft's vocabulary .* differs from the target's"):
        make_engine(target, speculative_config={"model": str(tmp_path), "num_speculative_tokens": 2})


def test_llm_takes_vllm_shaped_config(target):
    from inferlab.llm import LLM

    with pytest.raises(ValueError, match="unknown speculative method"):
        LLM(model="target", speculative_config={"method": "lookahead", "num_speculative_tokens": 2})
    with pytest.raises(InferlabError, match="no EAGLE draft at .*target_eagle: train one"):  # none ships for the toy
        LLM(model="target", speculative_config={"method": "eagle", "num_speculative_tokens": 2})
    llm = LLM.from_model(*target, speculative_config=NGRAM)
    assert llm.llm_engine.config.speculative_config == SpeculativeConfig("ngram", 3, 1, 4)
    out = llm.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0]
    plain = LLM.from_model(*target).generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=24,
                                                                          ignore_eos=True))[0]
    assert out.outputs[0].token_ids == plain.outputs[0].token_ids
    assert isinstance(llm.llm_engine, LLMEngine) and llm.llm_engine.counters["spec_decode_num_drafts"] > 0


def test_generate_cli_speculative_config(capsys):
    import json

    from inferlab.generate_cli import main

    args = ["def fib(n):\n", "--max-tokens", "30", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(args + ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["token_ids"] == plain["token_ids"] and spec["spec_decode_num_drafts"] > 0
    for bad, words in [("{method: ngram}", "not valid JSON"), ('{"method": "x", "num_speculative_tokens": 3}',
                                                                "unknown speculative method")]:
        with pytest.raises(SystemExit):
            main(args + ["--speculative-config", bad])
        err = capsys.readouterr().err.strip().splitlines()
        assert words in err[-1]


def test_a_new_proposer_plugs_in_through_the_interface(target):
    """Any ``Proposer`` drives the engine's speculative step: one that knows the greedy answer
    (an oracle) has every guess accepted, so 3 guesses per step take about a quarter of the steps,
    and the outputs are plain decoding's; one that always guesses wrong loses no token either."""
    from inferlab.engine.proposer import Proposer

    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = make_engine(target)
    for i, p in enumerate(PROMPTS[:3]):
        plain.add_request(str(i), p, params)
    want = {r: o.outputs[0].token_ids for r, o in run_all(plain).items()}

    class Oracle(Proposer):
        def __init__(self, wrong: bool):
            self.wrong = wrong

        def guess(self, seq, room):
            done = len(seq.output_token_ids)
            nxt = want[seq.request_id][done:done + room]
            return [(t + 1) % 100 for t in nxt] if self.wrong else nxt

    for wrong in (False, True):
        engine = make_engine(target, speculative_config=NGRAM)
        engine.proposer = Oracle(wrong)
        for i, p in enumerate(PROMPTS[:3]):
            engine.add_request(str(i), p, params)
        got = {r: o.outputs[0].token_ids for r, o in run_all(engine).items()}
        c = engine.counters
        assert got == want
        accepted = c["spec_decode_num_accepted_tokens"]
        assert accepted == (0 if wrong else c["spec_decode_num_draft_tokens"]) and c["spec_decode_num_drafts"] > 0
        if not wrong:
            assert c["num_steps"] < plain.counters["num_steps"] / 2
