"""Medusa heads: the heads themselves, their training labels, and the ``medusa`` proposer in the
engine (greedy outputs equal plain decoding under every knob, one target forward per step,
acceptance on held-out code, one-line errors)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inferlab.engine.config import EngineConfig
from inferlab.engine.llm_engine import LLMEngine
from inferlab.errors import InferlabError
from inferlab.model.loader import ASSETS, load_checkpoint
from inferlab.sampling import SamplingParams
from inferlab.spec.medusa import MedusaHeads, capture_hidden, heads_folder_for, load_heads, save_heads
from inferlab.spec.medusa_train import head_losses

from engine.conftest import same_greedy
from engine.test_spec_decode import assert_within_target_top_k

HEADS = ASSETS / "target_medusa"
MEDUSA = {"method": "medusa", "num_speculative_tokens": 3, "model": str(HEADS)}
HEAD = "import os\n\n\nclass Path:\n    def __init__(self, path):\n        self.path = path\n\n"
PROMPTS = ["def fib(n):\n", HEAD + "    def", "for i in range(10):\n    print(i", HEAD + "    def __repr__(self",
           "x = 1\n", HEAD + "    @property\n    def name(self):\n        return self.path.name\n\n    def"]


@pytest.fixture(scope="module")
def target():
    return load_checkpoint("target", device="cpu")


def run(pair, prompts, params, **knobs):
    model, tok = pair
    engine = LLMEngine(model, tok, EngineConfig(**knobs))
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params if isinstance(params, SamplingParams) else params[i])
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    return [finals[str(i)].outputs[0] for i in range(len(prompts))], engine


# ---------------------------------------------------------------- the heads

def test_a_fresh_head_is_the_targets_next_token_prediction(target):
    """W = 0, b = 0: h + SiLU(0) = h, so every head starts as the target's own lm_head."""
    model, tok = target
    ids = torch.tensor([tok.encode("def fib(n):\n    return")])
    with capture_hidden(model) as seen:
        logits = model(ids)
    heads = MedusaHeads(model.config.hidden_size, 3)
    out = heads(seen[-1], model.lm_head)
    assert out.shape == (3, *logits.shape)
    for i in range(3):
        torch.testing.assert_close(out[i], logits)


def test_head_i_learns_the_token_i_places_past_the_next(target):
    """Head 1's loss at h_t is scored against x_{t+2}, head 2's against x_{t+3} (off by one, the
    heads would learn the wrong position and never be accepted)."""
    model, tok = target
    tokens = torch.tensor([tok.encode("import os\nimport sys\n\ndef main(argv):\n    return 0\n")])
    heads = MedusaHeads(model.config.hidden_size, 2)  # identity heads: logits = the target's
    n, t = 2, tokens.shape[1] - 3
    with torch.no_grad():
        logits = model(tokens[:, :t + n])[0]
    want = [F.cross_entropy(logits[:t], tokens[0, 2 + i:2 + i + t]) for i in range(n)]
    torch.testing.assert_close(head_losses(heads, model, tokens), torch.stack(want))
    # self-distillation: the target's own choice for x_{t+2} is its argmax at position t + 1
    best = logits.argmax(-1)
    want = [F.cross_entropy(logits[:t], best[1 + i:1 + i + t]) for i in range(n)]
    torch.testing.assert_close(head_losses(heads, model, tokens, "target"), torch.stack(want))


def test_heads_round_trip_through_safetensors(tmp_path, target):
    model, _ = target
    heads = MedusaHeads(model.config.hidden_size, 2)
    torch.nn.init.normal_(heads.blocks[1].linear.weight)
    save_heads(heads, tmp_path / "h", "target")
    back = load_heads(tmp_path / "h", model.config.hidden_size)
    for a, b in zip(heads.parameters(), back.parameters()):
        torch.testing.assert_close(a, b)
    assert heads_folder_for("target") == HEADS


# ---------------------------------------------------------------- in the engine

def test_greedy_equals_plain_under_every_knob(target):
    """Mixed prompt lengths, chunked prefill, prefix caching and preemption: plain decoding's
    tokens, fewer steps, some guesses kept and some rejected."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    knobs = dict(block_size=8, num_kv_blocks=16, max_num_batched_tokens=24, max_num_seqs=6,
                 enable_chunked_prefill=True, enable_prefix_caching=True)
    want, plain = run(target, PROMPTS, params, **knobs)
    got, spec = run(target, PROMPTS, params, speculative_config=MEDUSA, **knobs)
    model, tok = target
    for p, g, w in zip(PROMPTS, got, want):  # equal, up to a float near-tie (see same_greedy)
        assert same_greedy(model, tok.encode(p), g.token_ids, w.token_ids)
    c = spec.counters
    assert spec.num_preemptions > 0 and spec.block_manager.prefix_hits > 0
    assert 0 < c["spec_decode_num_accepted_tokens"] < c["spec_decode_num_draft_tokens"]
    assert c["num_generation_tokens"] == plain.counters["num_generation_tokens"] == 40 * len(PROMPTS)
    assert c["num_steps"] < plain.counters["num_steps"]


def test_one_target_forward_per_step(target):
    """The heads read the verify forward's own hidden states: no second target forward."""
    model, _ = target
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        _, engine = run(target, PROMPTS[:3], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                        speculative_config=MEDUSA)
    finally:
        handle.remove()
    assert len(calls) == engine.counters["num_steps"] and engine.counters["spec_decode_num_accepted_tokens"] > 0


def held_out_prompts(tok, n: int, length: int) -> list[list[int]]:
    """Prompts cut from the corpus's test split: code neither the target nor the heads trained on."""
    from inferlab.eval.ppl import test_stream

    ids = test_stream(tok).tolist()
    step = len(ids) // n
    return [ids[i * step:i * step + length] for i in range(n)]


def test_acceptance_on_held_out_code(target):
    """Trained heads are accepted far more often than untrained ones (which guess the token just
    emitted again); the card's per-head accuracy says how far."""
    model, tok = target
    prompts = held_out_prompts(tok, 4, 48)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    rates = {}
    for name, folder in (("trained", HEADS), ("fresh", None)):
        if folder is None:
            import tempfile

            folder = tempfile.mkdtemp() + "/fresh"
            save_heads(MedusaHeads(model.config.hidden_size, 3), folder, "target")
        engine = LLMEngine(model, tok, EngineConfig(speculative_config={**MEDUSA, "model": str(folder)}))
        for i, p in enumerate(prompts):
            engine.add_request(str(i), p, params)
        while engine.has_unfinished_requests():
            engine.step()
        c = engine.counters
        rates[name] = c["spec_decode_num_accepted_tokens"] / c["spec_decode_num_draft_tokens"]
    assert rates["trained"] > 0.08 and rates["trained"] > 4 * rates["fresh"], rates


def test_sampled_tokens_stay_inside_the_requests_distribution(target):
    """Top-k 3 at temperature 1 with the deterministic-draft rule: every emitted token is one of
    the target's 3 best at its position; a seed reproduces the run."""
    params = SamplingParams(temperature=1.0, top_k=3, max_tokens=30, seed=0, ignore_eos=True)
    outs, engine = run(target, PROMPTS[:3], params, speculative_config=MEDUSA)
    again, _ = run(target, PROMPTS[:3], params, speculative_config=MEDUSA)
    assert [o.token_ids for o in outs] == [o.token_ids for o in again]
    c = engine.counters
    assert 0 < c["spec_decode_num_accepted_tokens"] < c["spec_decode_num_draft_tokens"]
    assert_within_target_top_k(target, PROMPTS, outs, 3)


def test_parallel_samples_with_medusa(target):
    """n = 3: the forked siblings start with no guesses and get their own from the next step."""
    params = SamplingParams(temperature=0.8, n=3, max_tokens=20, seed=5, ignore_eos=True)
    model, tok = target
    engine = LLMEngine(model, tok, EngineConfig(speculative_config=MEDUSA))
    engine.add_request("r", PROMPTS[1], params)
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            final = out
    assert [len(c.token_ids) for c in final.outputs] == [20, 20, 20]
    assert engine.counters["spec_decode_num_drafts"] > 3


# ---------------------------------------------------------------- errors

def test_errors_are_one_line(target, tmp_path):
    from inferlab.llm import LLM

    model, tok = target
    cases = [({**MEDUSA, "num_speculative_tokens": 9}, "Medusa heads .* are 4: .* k <= 4"),
             ({**MEDUSA, "model": str(tmp_path / "none")}, "no Medusa heads .*inferlab train medusa"),
             ({"method": "medusa", "num_speculative_tokens": 2}, "medusa method needs its folder"),
             ({"method": "medusa", "num_speculative_tokens": 2, "prompt_lookup_max": 3}, "unknown speculative_config keys"),
             ({"method": "medusa", "num_speculative_tokens": 0}, "num_speculative_tokens must be")]
    for bad, words in cases:
        with pytest.raises((ValueError, InferlabError), match=words) as e:
            LLMEngine(model, tok, EngineConfig(speculative_config=bad))
        assert "\n" not in str(e.value)
    small = MedusaHeads(64, 2)
    save_heads(small, tmp_path / "narrow", "other")
    with pytest.raises(InferlabError, match="width 64, the target's are 256"):
        LLMEngine(model, tok, EngineConfig(speculative_config={**MEDUSA, "model": str(tmp_path / "narrow")}))
    with pytest.raises(InferlabError, match="no Medusa heads .*draft_medusa.*inferlab train medusa"):
        LLM("draft", speculative_config={"method": "medusa", "num_speculative_tokens": 2})


def test_llm_finds_the_heads_beside_the_target(target):
    from inferlab.llm import LLM

    llm = LLM("target", speculative_config={"method": "medusa", "num_speculative_tokens": 2})
    assert llm.llm_engine.config.speculative_config.model == str(HEADS)
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0]
    (want,), _ = run(target, [PROMPTS[0]], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    assert out.outputs[0].token_ids == want.token_ids


def test_reference_loop_matches_the_engine(target):
    """The contiguous reference loop with the same heads: plain decoding's tokens, and the same
    guesses kept as the engine keeps (up to a float near-tie or two)."""
    from inferlab.generate import generate
    from inferlab.spec.medusa import MedusaGuesser
    from inferlab.spec.reference import speculative_generate

    model, tok = target
    heads = load_heads(HEADS, model.config.hidden_size)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    ids = tok.encode(PROMPTS[1])
    want = generate(model, [ids], [params])[0].output_token_ids
    seq, stats = speculative_generate(model, ids, params, MedusaGuesser(model, heads, 3))
    assert seq.output_token_ids == want
    (out,), engine = run(target, [PROMPTS[1]], params, speculative_config=MEDUSA)
    assert out.token_ids == want
    assert stats.accepted > 0 and abs(stats.accepted - engine.counters["spec_decode_num_accepted_tokens"]) <= 2
    with pytest.raises(ValueError, match="num_speculative_tokens must be in 1..4"):
        MedusaGuesser(model, heads, 5)


def test_generate_cli_with_medusa(capsys):
    import json

    from inferlab.generate_cli import main

    args = ["def fib(n):\n", "--max-tokens", "24", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(args + ["--speculative-config", '{"method": "medusa", "num_speculative_tokens": 2}']) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["token_ids"] == plain["token_ids"] and spec["spec_decode_num_drafts"] > 0


def test_sampled_outputs_follow_the_target(target):
    """The chi-square test of ``tests/engine/test_spec_distribution.py`` with Medusa's guesses:
    3000 seeded requests at temperature 1, top-k 3; the joint of the first three tokens (two of
    them through the verifier's deterministic-draft rule) follows the target's exact joint."""
    import collections

    from engine.test_spec_distribution import PROMPT, assert_chi_square, exact_joint

    model, tok = target
    params = SamplingParams(temperature=1.0, top_k=3, max_tokens=4, ignore_eos=True)
    prompt, n = tok.encode(PROMPT), 3000
    engine = LLMEngine(model, tok, EngineConfig(max_num_seqs=256, enable_prefix_caching=True,
                                                speculative_config={**MEDUSA, "num_speculative_tokens": 2}))
    for i in range(n):
        engine.add_request(str(i), prompt, SamplingParams(**{**params.__dict__, "seed": i}))
    counts = collections.Counter()
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                counts[tuple(o.outputs[0].token_ids[:3])] += 1
    c = engine.counters
    assert c["spec_decode_num_drafts"] > n and 0 < c["spec_decode_num_accepted_tokens"] < c["spec_decode_num_draft_tokens"]
    exp = exact_joint(model, prompt, params)
    assert set(counts) <= set(exp)
    assert_chi_square(counts, exp, n)


def test_answer_positions_label_each_head_with_the_target_choice_it_must_guess():
    """Chat heads learn from the target's own answers: h_t from the last prompt token on, and head i's
    label x_{t+1+i} (here head 1 at the last prompt token must guess the answer's second token)."""
    from types import SimpleNamespace

    from inferlab.spec.medusa_train import answer_positions

    target = SimpleNamespace(model=SimpleNamespace(norm=lambda f: f * 2))
    sample = {"prompt_ids": [1, 2, 3], "answer_ids": [4, 5, 6, 7, 8]}
    feature = torch.arange(8, dtype=torch.float16)[:, None].expand(8, 4)  # position p holds p
    h, labels = answer_positions(target, sample, feature, 2)
    assert h[:, 0].tolist() == [4.0, 6.0, 8.0]  # positions 2, 3, 4 through the final norm
    assert [y.tolist() for y in labels] == [[5, 6, 7], [6, 7, 8]]
    assert answer_positions(target, {"prompt_ids": [1, 2], "answer_ids": [3]}, feature[:3], 2) is None


def test_guess_vocab_restricts_guesses_and_survives_a_save(tmp_path):
    """Heads with a guess vocabulary guess the best token among it (the full head's logits at those
    ids), and keep it through save_heads / load_heads."""
    from torch import nn

    from inferlab.spec.medusa import MedusaHeads, load_heads, save_heads

    torch.manual_seed(0)
    heads, head = MedusaHeads(8, 2), nn.Linear(8, 50, bias=False)
    for b in heads.blocks:
        nn.init.normal_(b.linear.weight)
    h = torch.randn(5, 8)
    vocab = torch.tensor([3, 7, 11, 20, 41])
    heads.guess_vocab = vocab
    got = heads.propose(h, head, 2)
    full = heads(h, head)  # [2, 5, 50]
    assert torch.equal(got, vocab[full[:, :, vocab].argmax(-1)].T)
    assert set(got.flatten().tolist()) <= set(vocab.tolist())
    loaded = load_heads(save_heads(heads, tmp_path / "h", "toy"), 8)
    assert torch.equal(loaded.guess_vocab, vocab) and torch.equal(loaded.propose(h, head, 2), got)


def test_guess_rows_of_a_quantized_head_stay_quantized():
    """Under a Q8_0 head (smollm2 as stored) the guess vocabulary's rows are read in Q8_0 too, and
    each head still guesses the best of them (up to the loops' activation rounding)."""
    from torch import nn

    from inferlab.quant.ggml import GGMLLinear
    from inferlab.spec.medusa import MedusaHeads

    torch.manual_seed(0)
    heads, head = MedusaHeads(64, 3), GGMLLinear.from_float(nn.Linear(64, 80, bias=False), "q8_0")
    for b in heads.blocks:
        nn.init.normal_(b.linear.weight, std=0.2)
    heads.guess_vocab = torch.tensor([2, 9, 17, 33, 40, 41, 56, 79])
    h = torch.randn(4, 64)
    got = heads.propose(h, head, 3)  # [4, 3]
    assert isinstance(heads._rows[1], GGMLLinear)
    rows = head.dequantize()[heads.guess_vocab]
    for i, block in enumerate(heads.blocks):
        logits = block(h) @ rows.T  # [4, 8]
        picked = logits.gather(1, (got[:, i:i + 1] == heads.guess_vocab).int().argmax(1, keepdim=True))[:, 0]
        assert torch.all(logits.max(1).values - picked < 0.05 * logits.abs().max()), (i, got[:, i])
