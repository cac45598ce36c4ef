"""A confidence threshold on the model-based proposers (draft, EAGLE, Medusa): a sequence's chain
of guesses stops where the proposer's own estimate that it is accepted so far falls below the
threshold (EAGLE-2's confidence, ``inferlab.engine.proposer.cut_chain``). Greedy outputs
stay plain decoding's, fewer guesses are verified, and the ones kept are accepted more often."""
from __future__ import annotations

import pytest
import torch

from inferlab.engine.proposer import cut_chain
from inferlab.model.loader import ASSETS
from inferlab.sampling import SamplingParams

from .conftest import same_greedy
from .test_spec_decode import PROMPTS, run

K = 3
CONFIGS = {"draft": {"model": "draft", "num_speculative_tokens": K},
           "medusa": {"method": "medusa", "num_speculative_tokens": K, "model": str(ASSETS / "target_medusa")}}


def test_a_chain_goes_on_while_the_proposers_own_estimate_holds():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    p = logits.softmax(-1)
    onehot = torch.tensor([0.0, 1.0, 0.0, 0.0])
    # greedy: the raw softmax, whatever the one-hot q says; the estimate so far multiplies it
    sure, q = cut_chain(0.5, logits, onehot, 1, True, 0.1)
    assert sure == pytest.approx(0.5 * float(p[1])) and torch.equal(q, onehot)
    assert cut_chain(0.5, logits, onehot, 1, True, 0.5 * float(p[1]) + 1e-3) is None
    # sampled: the probability the proposer drew the token with, and q cut to the tokens it would
    # have kept (0.5 q >= 0.1: tokens 1..3), renormalised: the q a verified guess was drawn from
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    sure, kept = cut_chain(0.5, logits, q, 2, False, 0.1)
    assert sure == pytest.approx(0.15)
    torch.testing.assert_close(kept, torch.tensor([0.0, 0.2, 0.3, 0.4]) / 0.9)
    assert cut_chain(0.5, logits, q, 0, False, 0.1) is None


@pytest.mark.parametrize("method", ["draft", "eagle", "medusa"])
def test_a_threshold_drops_unlikely_guesses_and_keeps_the_output(target, method, request):
    config = request.getfixturevalue("eagle_config") if method == "eagle" else CONFIGS[method]
    model, tok = target
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    knobs = dict(block_size=8, max_num_seqs=6, enable_prefix_caching=True)
    want, _ = run(target, PROMPTS, params, **knobs)
    counts = {}
    for threshold in (0.0, 0.5):
        got, engine = run(target, PROMPTS, params, speculative_config={**config, "confidence_threshold": threshold},
                          **knobs)
        for p, g, w in zip(PROMPTS, got, want):
            assert same_greedy(model, tok.encode(p), g.token_ids, w.token_ids)
        c = engine.counters
        counts[threshold] = (c["spec_decode_num_drafts"], c["spec_decode_num_draft_tokens"],
                             c["spec_decode_num_accepted_tokens"])
    (d0, g0, a0), (d1, g1, a1) = counts[0.0], counts[0.5]
    assert 0 < d1 and g1 / d1 < g0 / d0 - 0.5, counts  # chains cut short: fewer guesses a step
    assert a1 / g1 > a0 / g0, counts  # the guesses kept are the likelier ones
