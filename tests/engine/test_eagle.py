"""EAGLE as a proposer of the engine's step (greedy outputs under every knob: test_spec_decode.py):
the features it keeps are the target's own (a teacher-forced forward's), its first guess is the
one the teacher-forced draft makes (what training fits), its q lives on the draft vocabulary, and
a folder that does not fit fails in one line."""
from __future__ import annotations

import pytest
import torch

from inferlab.attention import AttentionMetadata
from inferlab.errors import InferlabError
from inferlab.sampling import SamplingParams
from inferlab.spec.eagle import last_layer_features, load_eagle

from .conftest import make_engine, run_all, same_greedy
from .test_spec_decode import PROMPTS, run


def _teacher_forced(model, ids):
    with torch.inference_mode(), last_layer_features(model) as seen:
        model(torch.tensor([ids]))
    return seen[-1][0]


def _steps(engine, n):
    for _ in range(n):
        engine.step()


@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_kept_features_are_the_targets(target, eagle_config, threshold):
    """At every step that mixes a prefill, decodes with kept and rejected guesses and a last
    decode with no room for guesses (it goes first in the batch, ahead of a sequence scheduled
    before it), every feature the proposer keeps for a sequence equals the target's last-layer
    output at that position in one plain forward over its tokens. With a confidence threshold,
    chains cut after scheduling shrink the forward's rows: the features still land right."""
    model, tok = target
    engine = make_engine(target, max_num_seqs=4,
                         speculative_config={**eagle_config, "confidence_threshold": threshold})
    proposer, checked = engine.proposer, []
    observe = proposer.observe

    def checking_observe(out, ready, emitted, hidden, starts, running):
        observe(out, ready, emitted, hidden, starts, running)
        for seq in running:
            first, feats = proposer.features[seq.seq_id]
            want = _teacher_forced(model, seq.token_ids(0, seq.num_computed_tokens))
            assert first + len(feats) == seq.num_computed_tokens  # every computed position, none beyond
            torch.testing.assert_close(feats, want[first:], atol=2e-4, rtol=1e-4)
        checked.append([q for _, _, q in proposer.layout])

    proposer.observe = checking_observe
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    engine.add_request("a", PROMPTS[1], params)
    engine.add_request("short", PROMPTS[2], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    _steps(engine, 3)
    engine.add_request("b", PROMPTS[0], params)  # its prefill runs beside a's decodes
    _steps(engine, 4)
    if threshold:  # decodes whose chain was cut: fewer than k + 1 = 4 rows, more than 1
        assert any(1 < q < 4 for layout in checked for q in layout), checked
    else:
        assert [4, 1] in checked  # the step whose batch order is not the scheduled order ran
    assert engine.counters["spec_decode_num_drafts"] > 0


def test_first_guess_is_the_teacher_forced_drafts_choice(target, eagle_config):
    """The draft's inputs in the engine (token x_t with the target's f_{t-1}, over a paged cache
    filled step by step) are the ones training uses: its first guess at every step equals the
    argmax of the same draft run over the whole sequence at once, teacher-forced."""
    model, tok = target
    engine = make_engine(target, max_num_seqs=2, speculative_config=eagle_config)
    proposer = engine.proposer
    seen = []
    fill = proposer.fill

    def recording_fill(out, block_manager):
        q = fill(out, block_manager)
        for s in out.scheduled:
            if s.spec_token_ids:
                seen.append((s.seq.token_ids(0, s.seq.num_computed_tokens + s.num_committed), s.spec_token_ids[0]))
        return q

    proposer.fill = recording_fill
    engine.add_request("a", PROMPTS[3], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    run_all(engine)
    draft = load_eagle(eagle_config["model"], model.config)
    assert len(seen) >= 5
    for ids, guess in seen:
        f = _teacher_forced(model, ids)
        prev = torch.cat([torch.zeros_like(f[:1]), f[:-1]])[None]
        with torch.inference_mode():
            e = model.model.embed_tokens(torch.tensor([ids]))
            logits = draft.logits(draft(e, prev, AttentionMetadata(positions=torch.arange(len(ids))[None])))[0, -1]
        best = int(draft.d2t[logits.argmax()])
        small = int((draft.d2t == guess).nonzero())
        assert guess == best or abs(float(logits.max() - logits[small])) < 1e-4


def test_q_lives_on_the_draft_vocabulary(target, eagle_config):
    """Sampled requests get q rows that sum to one over the draft vocabulary and are zero off it,
    and every guess is a token of it."""
    engine = make_engine(target, max_num_seqs=2, speculative_config=eagle_config)
    proposer, rows, guesses = engine.proposer, [], []
    fill = proposer.fill

    def recording_fill(out, block_manager):
        q = fill(out, block_manager)
        rows.extend(q.values())
        guesses.extend(t for s in out.scheduled for t in s.spec_token_ids)
        return q

    proposer.fill = recording_fill
    for i in range(2):
        engine.add_request(str(i), PROMPTS[i], SamplingParams(temperature=1.0, max_tokens=16, seed=i, ignore_eos=True))
    run_all(engine)
    q = torch.cat(rows)
    off = torch.ones(q.shape[1], dtype=torch.bool)
    off[proposer.draft.d2t] = False
    assert len(q) > 5 and torch.allclose(q.sum(-1), torch.ones(len(q)), atol=1e-5)
    assert float(q[:, off].abs().max()) == 0.0
    assert set(guesses) <= set(proposer.draft.d2t.tolist())


def test_a_folder_that_does_not_fit_fails_in_one_line(target, eagle_config, tmp_path):
    model, _ = target
    with pytest.raises(InferlabError, match="inferlab train eagle"):
        load_eagle(tmp_path / "missing", model.config)
    import dataclasses
    other = dataclasses.replace(model.config, hidden_size=model.config.hidden_size * 2)
    with pytest.raises(InferlabError, match="train one for it"):
        load_eagle(eagle_config["model"], other)


def test_a_quantized_target_gets_a_quantized_draft(target, eagle_config):
    """Under a target run from Q8_0 weights the draft's linears are Q8_0 too (its bytes set c),
    and greedy outputs still equal plain decoding on that target."""
    import copy

    from inferlab.quant import GGMLLinear, quantize_model

    model, tok = target
    q = copy.deepcopy(model)
    quantize_model(q, "q8_0")
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    want, _ = run((q, tok), PROMPTS[:3], params)
    got, spec = run((q, tok), PROMPTS[:3], params, speculative_config=eagle_config)
    linears = [m for m in spec.proposer.draft.modules() if isinstance(m, (torch.nn.Linear, GGMLLinear))]
    assert len(linears) == 9 and all(isinstance(m, GGMLLinear) for m in linears)
    # The Q8_0 loops round activations to int8 per block of 32, as llama.cpp's Q8_0 dot product
    # does, while same_greedy's reference (one forward of the whole text) dequantizes and multiplies
    # in float: the two sit about 1e-2 apart in logits (0.0075 measured at a near-tie), so a tie
    # here is anything within 0.03, not fp32's 1e-4.
    for p, g, w in zip(PROMPTS, got, want):
        assert same_greedy(q, tok.encode(p), g.token_ids, w.token_ids, tol=0.03)
    assert spec.counters["spec_decode_num_accepted_tokens"] > 0
