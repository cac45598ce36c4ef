"""Every decoder layer in one C call (inferlab.model.decode_layers): the same bits as the layers run
one module at a time, for decodes, verifies and short prompts, in every format with a loop; and the
per-module path wherever a hook, a swapped module or a long prompt needs it."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from inferlab.engine import model_runner
from inferlab.model import decode_layers, llama
from inferlab.quant import quantize_model
from inferlab.quant.fused import compiler_available
from inferlab.sampling import SamplingParams

from .conftest import make_engine, run_all
from .test_spec_decode import HEAD, NGRAM, PROMPTS, run

pytestmark = pytest.mark.skipif(not compiler_available(), reason="no C compiler: the layers run module by module")


@pytest.fixture
def compared(monkeypatch):
    """Run the C layers on a copy of each forward's input, then the modules on the input itself, and
    record (rows, largest difference); the modules' result goes on, so both paths see the same state."""
    seen = []
    real = decode_layers.run

    def both(model, x, cos, sin, meta, stock):
        fused = x.clone()
        if not real(model, fused, cos, sin, meta, stock):
            seen.append((x.shape[1], None))
            return False
        y = x
        for layer in model.model.layers:
            y = layer(y, cos, sin, meta)
        seen.append((x.shape[1], (fused - y).abs().max().item(), meta.num_multi_query))
        x.copy_(y)
        return True
    monkeypatch.setattr(decode_layers, "run", both)
    return seen


def _toy_limits(monkeypatch, rows: int = 64) -> None:
    """The toy's context (512) holds no prompt longer than the real limits: lower them to its scale."""
    monkeypatch.setattr(model_runner, "SHORT_PROMPT_MAX", rows)
    monkeypatch.setattr(decode_layers, "MAX_ROWS", rows)


@pytest.mark.parametrize("method", [None, "int8", "int4", "q8_0", "q4_0", "q4_1", "nf4"])
def test_decodes_are_the_modules_bits(target, compared, method):
    """A batch of decodes of different lengths: the C layers write what the modules compute, bit for bit."""
    model, tok = target
    if method:
        model = copy.deepcopy(model)
        quantize_model(model, method, group_size=64) if method == "int4" else quantize_model(model, method)
    run((model, tok), PROMPTS[:3], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), max_num_seqs=3)
    decodes = [s for s in compared if s[1] is not None]
    assert decodes, f"{method}: the C layers never ran ({compared})"
    assert all(diff == 0.0 for _, diff, _ in decodes), decodes


def test_verifies_match_the_modules(target, compared):
    """Speculative verifies (several rows per sequence, each seeing the positions up to its own), alone
    and beside decodes: the same bits as the modules (whose verify attention is the same C loop), and
    the same tokens as decoding without speculation."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs, _ = run(target, PROMPTS[:2], params, speculative_config=NGRAM, max_num_seqs=2)
    verifies = [s for s in compared if s[1] is not None and s[2]]
    assert verifies, "no verify step ran through the C layers"
    assert all(diff == 0.0 for _, diff, _ in verifies), verifies
    compared.clear()
    plain, _ = run(target, PROMPTS[:2], params, max_num_seqs=2)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]


def test_long_prompts_hooks_and_other_modules_take_the_module_path(target, monkeypatch):
    """A short prompt takes the C layers; a long prompt, a hook and a swapped-in module each run the
    modules; a replaced weight is read."""
    model, tok = target
    model = copy.deepcopy(model)
    calls = []
    real = decode_layers.run
    monkeypatch.setattr(decode_layers, "run", lambda *a: calls.append(real(*a)) or calls[-1])
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    run((model, tok), PROMPTS[:1], params)
    assert calls == [True, True, True]  # the prompt, then two decodes
    calls.clear()
    _toy_limits(monkeypatch)
    long_prompt = HEAD * 4
    assert len(tok.encode(long_prompt)) > model_runner.SHORT_PROMPT_MAX
    run((model, tok), [long_prompt], params)
    assert calls == [False, True, True]  # the long prompt runs one SDPA call per layer

    seen = []
    handle = model.model.layers[1].mlp.down_proj.register_forward_hook(lambda *a: seen.append(1))
    calls.clear()
    run((model, tok), PROMPTS[:1], params)
    handle.remove()
    assert calls == [False, False, False] and len(seen) == 3

    # a new weight object (same shape) must be read, not the old pointer: zeroing every o_proj
    # changes the output of the C path exactly as it changes the modules'
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight = nn.Parameter(torch.zeros_like(layer.self_attn.o_proj.weight))
    calls.clear()
    fused, _ = run((model, tok), PROMPTS[:1], params)
    assert calls == [True, True, True]
    monkeypatch.setattr(decode_layers, "run", lambda *a: False)
    modules, _ = run((model, tok), PROMPTS[:1], params)
    assert fused[0].token_ids == modules[0].token_ids

    class Probe(llama.MLP):  # a lab's own MLP: not the arithmetic the C file repeats
        pass
    monkeypatch.setattr(decode_layers, "run", lambda *a: calls.append(real(*a)) or calls[-1])
    model.model.layers[0].mlp.__class__ = Probe
    calls.clear()
    run((model, tok), PROMPTS[:1], params)
    assert calls == [False, False, False]


def test_a_quantized_weight_changed_in_place_is_read(target, monkeypatch):
    """Q4_1's loop reads a copy of qweight laid out in tiles of 16 outputs: a change made to qweight in
    place (load_state_dict copies in place) between two steps of one engine rebuilds the copy, in the
    C layers as in the modules."""
    model, tok = target
    model = copy.deepcopy(model)
    quantize_model(model, "q4_1")
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    engine = make_engine((model, tok))

    def generate(name):
        engine.add_request(name, PROMPTS[0], params)
        return run_all(engine)[name].outputs[0].token_ids
    before = generate("before")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.qweight.zero_()  # d = m = 0: every o_proj now gives zeros
    calls = []
    real = decode_layers.run
    monkeypatch.setattr(decode_layers, "run", lambda *a: calls.append(real(*a)) or calls[-1])
    fused = generate("fused")
    assert calls == [True, True, True, True]
    monkeypatch.setattr(decode_layers, "run", lambda *a: False)
    assert fused == generate("modules") != before


@pytest.mark.parametrize("variant", ["llama_bias", "mistral_window8", "qwen2_bias"])
def test_biases_and_windows_are_the_modules_bits(variant, tmp_path, compared):
    """Projection biases (Llama with attention_bias, Qwen2) and a sliding window that bites (8 positions
    of a 20-token context): the C layers against the modules, bit for bit, on transformers-made models."""
    from core.checkpoints import save_variant

    from inferlab.model.loader import load_checkpoint
    save_variant(variant, tmp_path)
    model, _ = load_checkpoint(tmp_path, device="cpu")
    prompts = [[5, 9, 14, 3, 7, 22, 31, 8, 4, 17, 12, 6], [40, 41, 42]]
    run((model, None), prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), max_num_seqs=2)
    decodes = [s for s in compared if s[1] is not None]
    assert len(decodes) >= 7, compared
    assert all(diff == 0.0 for _, diff, _ in decodes), decodes


@pytest.mark.parametrize("method", [None, "q4_1"])
def test_a_sequence_gets_the_same_bits_alone_batched_and_speculating(target, method):
    """Batch invariance (He et al., Thinking Machines 2025): a sequence's log-probs are the same bits
    whether it decodes alone, two at a time with a prompt joining their step when one finishes, or
    under speculation (its rows verified four at a time beside another sequence's). Contexts of several parts of the attention's split, on
    two threads: where the split or an op depended on the rows beside it, a near-tie somewhere
    flips a greedy token on the real model. (A prompt cut into other chunks is another computation:
    no chunking here.)"""
    model, tok = target
    if method:
        model = copy.deepcopy(model)
        quantize_model(model, method)
    prompts = [HEAD * (16 + i) + tail for i, tail in enumerate(["    def", "    def __repr__(self", "x = 1\n", "    @property\n"])]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=0) for n in (6, 12, 9, 12)]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        alone = [run((model, tok), [p], [q])[0][0] for p, q in zip(prompts, params)]
        batched, plain = run((model, tok), prompts, params, max_num_seqs=2)
        spec, _ = run((model, tok), prompts, params, max_num_seqs=2, speculative_config=NGRAM)
    finally:
        torch.set_num_threads(threads)
    assert min(len(tok.encode(p)) for p in prompts) > 3 * 128  # several parts of the attention's split
    bits = lambda out: [(t, lp[t].logprob) for t, lp in zip(out.token_ids, out.logprobs)]  # noqa: E731
    for i, a in enumerate(alone):
        assert bits(batched[i]) == bits(a), ("batched", i)
        assert bits(spec[i]) == bits(a), ("speculating", i)


def test_a_short_prompt_gets_the_same_bits_in_either_path(target, compared, monkeypatch):
    """A short prompt's rows take the same C loop whether its step runs the C layers (prefilled alone)
    or the modules (beside a prompt too long for the C layers): continuous batching puts prompts in
    any step, so where they went through SDPA in one path and the C loop in the other, a sequence's
    log-probs would depend on who shared its first step."""
    model, tok = target
    _toy_limits(monkeypatch)
    short, long_prompt = PROMPTS[1], HEAD * 4
    assert len(tok.encode(short)) > 1 and len(tok.encode(long_prompt)) > decode_layers.MAX_ROWS
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    alone, _ = run(target, [short], params)
    assert compared[0][1] is not None, "the short prompt alone did not take the C layers"
    compared.clear()
    together, _ = run(target, [short, long_prompt], params, max_num_seqs=2)
    assert compared[0][1] is None, "the two prompts' step should run the modules"
    bits = lambda out: [(t, lp[t].logprob) for t, lp in zip(out.token_ids, out.logprobs)]  # noqa: E731
    assert bits(together[0]) == bits(alone[0])


def test_the_eagle_drafts_layer_is_the_modules_bits(target, eagle_config, compared, monkeypatch):
    """EAGLE's drafting passes (its one layer over the guessed rows) take the same C call as the
    target's layers, with the bits the module gives."""
    inner, callers = decode_layers.run, []

    def spy(model, *args):
        callers.append(type(model).__name__)
        return inner(model, *args)
    monkeypatch.setattr(decode_layers, "run", spy)
    engine = make_engine(target, max_num_seqs=2, speculative_config=eagle_config)
    for i in range(2):
        engine.add_request(str(i), PROMPTS[i], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    run_all(engine)
    drafted = [c for who, c in zip(callers, compared) if who == "_Stack" and c[1] is not None]
    assert len(drafted) > 5 and any(c[0] > 1 for c in drafted)  # single rows and several at once
    assert all(c[1] == 0.0 for c in drafted), drafted


def test_engines_side_by_side_share_one_plan(target, monkeypatch):
    """Two engines over one model, stepped in turn (a benchmark's runs side by side): the plan is
    re-pointed at each engine's own cache, never rebuilt (~3 ms on smollm2, as long as its step),
    and each engine's outputs are those it gives alone."""
    model, tok = target
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    alone = []
    for p in PROMPTS[:2]:
        e = make_engine(target, max_num_seqs=2)
        e.add_request("0", tok.encode(p), params)
        alone.append(run_all(e)["0"].outputs[0].token_ids)
    engines = [make_engine(target, max_num_seqs=2) for _ in PROMPTS[:2]]
    for i, (e, p) in enumerate(zip(engines, PROMPTS)):
        e.add_request(str(i), tok.encode(p), params)
    built, real = [], decode_layers._Plan
    monkeypatch.setattr(decode_layers, "_Plan", lambda *a: built.append(1) or real(*a))
    finals = {}
    while any(e.has_unfinished_requests() for e in engines):
        for e in engines:
            for o in e.step() if e.has_unfinished_requests() else []:
                if o.finished:
                    finals[o.request_id] = o.outputs[0].token_ids
    assert [finals["0"], finals["1"]] == alone
    assert len(built) <= 1, built  # at most the first step's (a plan left from an earlier test is re-pointed)
