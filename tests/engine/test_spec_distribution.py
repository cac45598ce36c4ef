"""Sampled speculative decoding through the engine follows the target's distribution: a
chi-square test over the joint of the first three tokens (3000 seeded requests, two guesses
per decode from prompt lookup or from the draft model, so the second and third tokens come from the verifier: accepted guesses,
tokens drawn from the residual after a rejection, bonus tokens). The exact joint is enumerated
from the target over top-k's support; cells expected under 5 times are pooled."""
from __future__ import annotations

import collections
import math

import pytest
import torch

from inferlab.sampling import SamplingParams, probs_from_logits

from .conftest import make_engine, run_all

PROMPT = "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i"


def chi2_quantile(df: int, z: float = 3.09) -> float:
    """The chi-square quantile at the normal quantile z (3.09: 0.999), Wilson-Hilferty's approximation."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def assert_chi_square(counts, exp: dict, n: int) -> None:
    """``n`` samples' ``counts`` against the exact joint ``exp``: Pearson's chi-square, cells
    expected under 5 times pooled into one."""
    big = [k for k, v in exp.items() if n * v >= 5]
    small = [k for k in exp if k not in big]
    cells = [(counts.get(k, 0), n * exp[k]) for k in big]
    if small:
        cells.append((sum(counts.get(k, 0) for k in small), n * sum(exp[k] for k in small)))
    if len(cells) < 2:  # one outcome: nothing to compare beyond every sample landing there
        assert sum(counts.values()) == n
        return
    chi = sum((o - e) ** 2 / e for o, e in cells)
    assert chi < chi2_quantile(len(cells) - 1), (chi, len(cells) - 1)


def exact_joint(model, prompt, params, depth=3, prefix=(), mass=1.0, out=None, cut=1e-7):
    out = {} if out is None else out
    with torch.inference_mode():
        p = probs_from_logits(model(torch.tensor([prompt + list(prefix)]))[0, -1], params)
    for t in (p > cut).nonzero().flatten().tolist():
        if depth == 1:
            out[prefix + (t,)] = mass * float(p[t])
        else:
            exact_joint(model, prompt, params, depth - 1, prefix + (t,), mass * float(p[t]), out)
    return out


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, top_k=3, max_tokens=4, ignore_eos=True),
    pytest.param(SamplingParams(temperature=0.7, top_p=0.9, top_k=4, max_tokens=4, ignore_eos=True),
                 marks=pytest.mark.slow),
])
@pytest.mark.parametrize("spec_config", [{"method": "ngram", "num_speculative_tokens": 2},
                                         {"model": "draft", "num_speculative_tokens": 2},
                                         {"model": "draft", "num_speculative_tokens": 2, "confidence_threshold": 0.3},
                                         "eagle"],
                         ids=["ngram", "draft", "draft-confident", "eagle"])
def test_sampled_outputs_follow_the_target(target, params, spec_config, request):
    if spec_config == "eagle":  # q over a draft vocabulary: zero outside it
        spec_config = {**request.getfixturevalue("eagle_config"), "num_speculative_tokens": 2}
    model, tok = target
    prompt, n = tok.encode(PROMPT), 3000
    engine = make_engine(target, max_num_seqs=256, enable_prefix_caching=True, speculative_config=spec_config)
    for i in range(n):
        engine.add_request(str(i), prompt, SamplingParams(**{**params.__dict__, "seed": i}))
    counts = collections.Counter(tuple(o.outputs[0].token_ids[:3]) for o in run_all(engine).values())
    c = engine.counters
    assert c["spec_decode_num_drafts"] > n and 0 < c["spec_decode_num_accepted_tokens"] < c["spec_decode_num_draft_tokens"]
    if spec_config.get("confidence_threshold"):  # chains cut at the proposer's own doubt: still the target's joint
        assert c["spec_decode_num_draft_tokens"] < 1.9 * c["spec_decode_num_drafts"]
    exp = exact_joint(model, prompt, params)
    assert set(counts) <= set(exp) and abs(sum(exp.values()) - 1) < 1e-4
    assert_chi_square(counts, exp, n)
