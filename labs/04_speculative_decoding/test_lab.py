"""Graded tests for lab 04. `inferlab grade labs/04_speculative_decoding` runs them against starter.py;
with --reference they run against inferlab.spec, the reference solution.

The verifier is graded by exactness: an exact enumeration of every guess and every accept/reject
outcome on a 4-token vocabulary (the distribution of the tokens it emits must be the target's, to
1e-9), and a chi-square test on thousands of real draws. The proposer and the verifier are then
plugged into the real engine (``LLM``), whose greedy outputs must equal plain decoding's."""
import itertools
import math

import torch
from hypothesis import given, settings, strategies as st

from inferlab import LLM, labkit
from inferlab.engine.proposer import PromptLookupProposer
from inferlab.sampling import SamplingParams

lab = labkit.implementation(__file__, reference="inferlab.spec",
                            functions=["NgramProposer", "recovered_probs", "rejection_sample"])

V = 4  # the toy vocabulary


# ---------------------------------------------------------------- the n-gram proposer

def lookup(tokens, k, lo, hi):
    """Prompt lookup, spelled out: longest n first, the most recent earlier occurrence."""
    for n in range(min(hi, len(tokens) - 1), lo - 1, -1):
        for i in range(len(tokens) - n - 1, -1, -1):
            if tokens[i:i + n] == tokens[-n:]:
                return tokens[i + n:i + n + k]
    return []


def propose(k, lo, hi, tokens):
    return list(lab.NgramProposer(k, lo, hi).propose(list(tokens)))


@labkit.points(2)
def test_ngram_copies_what_followed_the_last_occurrence():
    #         0  1  2  3  4  5  6  7  8  9  10
    tokens = [5, 6, 7, 8, 9, 5, 6, 1, 2, 5, 6]
    # (5, 6) occurs at 0 and 5: the most recent one was followed by 1, 2, 5
    labkit.check(propose, 3, 1, 2, tokens, expected=[1, 2, 5])
    labkit.check(propose, 2, 1, 2, tokens, expected=[1, 2])


@labkit.points(2)
def test_ngram_longer_matches_win_over_recent_short_ones():
    tokens = [1, 2, 3, 40, 41, 9, 3, 50, 1, 2, 3]
    # (1, 2, 3) occurs at 0 -> 40, 41; the 1-gram (3,) occurred more recently at 6 -> 50
    labkit.check(propose, 2, 1, 3, tokens, expected=[40, 41])
    labkit.check(propose, 2, 1, 1, tokens, expected=[50, 1])


@labkit.points(1)
def test_ngram_no_match_and_the_end_truncates():
    labkit.check(propose, 4, 2, 3, [1, 2, 3, 4], expected=[])
    labkit.check(propose, 4, 1, 3, [7], expected=[])
    labkit.check(propose, 4, 2, 3, [1, 2, 9, 1, 2], expected=[9, 1, 2])   # only three tokens follow
    labkit.check(propose, 3, 2, 2, [1, 1, 1], expected=[1])               # an occurrence may overlap the suffix


@labkit.points(2)
@settings(max_examples=150, derandomize=True, database=None, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=14), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2))
def test_ngram_matches_the_rule_on_any_sequence(tokens, k, lo, extra):
    labkit.check(propose, k, lo, lo + extra, tokens, expected=lookup(tokens, k, lo, lo + extra))


# ---------------------------------------------------------------- the residual

@labkit.points(2)
def test_recovered_probs_is_the_normalised_residual():
    # row 1's q is not a distribution (as float rounding can leave one): p <= q everywhere
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.5, 0.5, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4]], dtype=torch.float64)
    q = torch.tensor([[0.2, 0.4, 0.2, 0.2], [0.6, 0.5, 0.1, 0.1], [0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
    expected = torch.tensor([[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 0.25, 0.75]], dtype=torch.float64)
    got = lab.recovered_probs(p, q)
    labkit.expect(torch.allclose(got.double(), expected, atol=1e-6),
                  "row 0: only token 0 has p > q; row 1: p <= q everywhere, so the row falls back to p; "
                  "row 2: max(0, p - q) = [0, 0, 0.1, 0.3], normalised", got=got.tolist(), expected=expected.tolist())


# ---------------------------------------------------------------- the verifier, exactly

def toy_tables(seed: int):
    """p(. | last token) and q(. | last token) on the toy vocabulary: a 'target' and a 'draft'."""
    g = torch.Generator().manual_seed(seed)
    p = (1.5 * torch.randn(V, V, generator=g)).double().softmax(-1)
    q = (1.5 * torch.randn(V, V, generator=g)).double().softmax(-1)
    return p, q


class DrawRecorder:
    """Stands in for ``draw`` in the verifier's module: keeps every row it is asked to draw from,
    returns a valid token, so the enumeration knows the exact distribution of each last token."""

    def __init__(self):
        self.rows = []

    def __call__(self, probs, generators=None):
        probs = torch.as_tensor(probs)
        probs = probs[None] if probs.dim() == 1 else probs
        self.rows.extend(probs.detach().double().cpu())
        return probs.argmax(-1)


def enumerate_verifier(monkeypatch, p, q, guesses_of, deterministic: bool):
    """Joint distribution of the first three tokens emitted from context 0 (a step with k = 2,
    continued with the target's own distribution after it), by exact enumeration of the guesses,
    of which guesses are accepted (uniforms placed just inside and just outside min(1, p/q)), and
    of the last token's distribution as the verifier hands it to draw()."""
    fn = lab.rejection_sample
    recorder = DrawRecorder()
    labkit.expect("draw" in getattr(fn, "__globals__", {}),
                  "rejection_sample must draw the last tokens with draw() from inferlab.sampling "
                  "(keep the starter's import of it)")
    monkeypatch.setitem(fn.__globals__, "draw", recorder)
    eye = torch.eye(V, dtype=torch.float64)
    cases, target_rows, draft_rows, uniforms = [], [], [], []
    for (x1, x2), weight in guesses_of.items():
        q1, q2 = (eye[x1], eye[x2]) if deterministic else (q[0], q[x1])
        a = [min(1.0, (p[0, x1] / q1[x1]).item()), min(1.0, (p[x1, x2] / q2[x2]).item())]
        for n in range(3):  # n guesses accepted, then a rejection (n < 2) or the bonus (n == 2)
            branch = weight * math.prod(a[:n]) * ((1 - a[n]) if n < 2 else 1.0)
            if branch <= 0:
                continue
            u = [a[j] * (1 - 1e-4) if j < n else a[j] + (1 - a[j]) * 1e-4 if j == n else 0.5 for j in range(2)]
            cases.append(((x1, x2), n, branch))
            target_rows += [p[0], p[x1], p[x2]]
            draft_rows += [q1, q2]
            uniforms.append(u)
    out = fn([list(c[0]) for c in cases], torch.stack(target_rows), None if deterministic else torch.stack(draft_rows),
             [None] * len(cases), torch.tensor(uniforms, dtype=torch.float64))
    labkit.expect(isinstance(out, list) and len(out) == len(cases),
                  "rejection_sample returns one list of tokens per sequence", sequences=len(cases),
                  got=type(out).__name__ if not isinstance(out, list) else f"{len(out)} lists")
    labkit.expect(len(recorder.rows) == len(cases),
                  "draw() is called for exactly one row per sequence (its last token)",
                  sequences=len(cases), rows_drawn=len(recorder.rows))
    joint = torch.zeros(V, V, V, dtype=torch.float64)
    for ((x1, x2), n, branch), emitted, row in zip(cases, out, recorder.rows):
        emitted = [int(t) for t in emitted]
        labkit.expect(emitted[:-1] == [x1, x2][:n] and len(emitted) == n + 1,
                      "with uniforms below min(1, p/q) a guess is accepted, above it rejected, and the "
                      "step ends at the first rejection", guesses=[x1, x2], uniforms_accept=[j < n for j in range(2)],
                      expected_prefix=[x1, x2][:n], emitted=emitted)
        labkit.expect(row.shape == (V,) and abs(row.sum().item() - 1) < 1e-6,
                      "the row given to draw() is a distribution over the vocabulary", row=row.tolist())
        if n == 0:
            joint += branch * row[:, None, None] * p[:, :, None] * p[None, :, :]
        elif n == 1:
            joint[x1] += branch * row[:, None] * p
        else:
            joint[x1, x2] += branch * row
    expected = p[0][:, None, None] * p[:, :, None] * p[None, :, :]
    worst = (joint - expected).abs().max().item()
    labkit.expect(worst < 1e-9, "the distribution of the emitted tokens, enumerated exactly, equals the "
                  "target's p(a) p(b | a) p(c | b)", largest_difference=f"{worst:.3g}")


@labkit.points(3)
def test_exact_enumeration_with_a_draft_distribution(monkeypatch):
    for seed in (0, 1):
        p, q = toy_tables(seed)
        guesses = {(x1, x2): (q[0, x1] * q[x1, x2]).item() for x1, x2 in itertools.product(range(V), repeat=2)}
        enumerate_verifier(monkeypatch, p, q, guesses, deterministic=False)


@labkit.points(2)
def test_exact_enumeration_with_deterministic_guesses(monkeypatch):
    p, q = toy_tables(2)
    for fixed in ((2, 1), (0, 3)):  # an n-gram proposer always makes the same guesses: q is one-hot
        enumerate_verifier(monkeypatch, p, q, {fixed: 1.0}, deterministic=True)


@labkit.points(1)
def test_greedy_keeps_guesses_while_they_are_the_argmax():
    onehot = torch.eye(6)[[3, 4, 5, 1]]  # the target's argmax at each of the 4 rows
    got = lab.rejection_sample([[3, 4, 0]], onehot)
    labkit.expect([int(t) for t in got[0]] == [3, 4, 5], "a greedy target (one-hot p) keeps the guesses "
                  "that equal its argmax and replaces the first that does not", guesses=[3, 4, 0], emitted=got[0])
    got = lab.rejection_sample([[3, 4, 5], []], torch.eye(6)[[3, 4, 5, 1, 2]])
    labkit.expect([[int(t) for t in x] for x in got] == [[3, 4, 5, 1], [2]],
                  "all guesses kept: the bonus token follows; no guesses: one token, as plain decoding", emitted=got)


def chi2_critical(dof: int, z: float = 3.29) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.29: the 99.95th)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


@labkit.points(3)
def test_real_draws_follow_the_target():
    """4000 steps with random guesses and the verifier's own uniforms and draws: a chi-square test
    of the first two emitted tokens against the target's joint (and far from the draft's)."""
    p, q = (t.float() for t in toy_tables(0))
    n = 4000
    g = torch.Generator().manual_seed(1)
    x1 = torch.multinomial(q[0].expand(n, V), 1, generator=g)[:, 0]
    x2 = torch.multinomial(q[x1], 1, generator=g)[:, 0]
    target = torch.stack([p[0].expand(n, V), p[x1], p[x2]], 1).reshape(3 * n, V)
    draft = torch.stack([q[0].expand(n, V), q[x1]], 1).reshape(2 * n, V)
    torch.manual_seed(2)
    out = lab.rejection_sample([[a, b] for a, b in zip(x1.tolist(), x2.tolist())], target, draft)
    pairs = []
    for emitted in out:
        emitted = [int(t) for t in emitted]
        if len(emitted) == 1:  # the step emitted one token: the target continues
            emitted += torch.multinomial(p[emitted[0]], 1, generator=g).tolist()
        pairs.append(emitted[0] * V + emitted[1])
    counts = torch.bincount(torch.tensor(pairs), minlength=V * V).double()
    expected = (p[0][:, None] * p).flatten().double() * n
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    labkit.expect(chi2 < chi2_critical(V * V - 1), "the first two tokens of 4000 verified steps follow the "
                  "target's joint p(a) p(b | a) (chi-square test at the 99.95th percentile)",
                  chi2=f"{chi2:.1f}", critical=f"{chi2_critical(V * V - 1):.1f}")


# ---------------------------------------------------------------- in the real engine

PROMPTS = ["def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\ndef fib",
           "import os\n", "for i in range(10):\n    print(i)\nfor j in range(10):\n", "class Node:"]
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


class Counted:
    """Wraps a callable and counts the calls, so the test knows the engine used it."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def speculative_outputs(spec: dict, with_proposer: bool, **knobs):
    llm = LLM(model="mha", speculative_config=spec, **knobs)
    engine = llm.llm_engine
    verifier = Counted(lab.rejection_sample)
    engine.rejection_sampler = verifier
    if with_proposer:
        engine.proposer = PromptLookupProposer(lab.NgramProposer(spec["num_speculative_tokens"], 1,
                                                                 spec["prompt_lookup_max"]))
    outs = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    labkit.expect(verifier.calls > 0, "the engine verified guesses with your rejection_sample")
    return outs, engine


def plain_outputs(**knobs):
    return [o.outputs[0].token_ids for o in LLM(model="mha", **knobs).generate(PROMPTS, GREEDY)]


@labkit.points(3)
def test_engine_ngram_greedy_outputs_equal_plain_decoding():
    knobs = dict(block_size=8, num_kv_blocks=16, max_num_seqs=4, max_num_batched_tokens=32, enable_chunked_prefill=True,
                 enable_prefix_caching=True)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    outs, engine = speculative_outputs(spec, with_proposer=True, **knobs)
    counters = engine.counters
    plain = plain_outputs(**knobs)
    labkit.expect(engine.num_preemptions > 0, "the small KV pool preempted sequences (they were recomputed)")
    for prompt, got, want in zip(PROMPTS, outs, plain):
        labkit.expect(got == want, "speculation changes how fast tokens come, never which: greedy outputs through "
                      "the engine (your proposer and verifier, chunked prefill, prefix caching, a KV pool small enough to preempt) "
                      "equal plain decoding's", prompt=prompt, plain=want, speculative=got)
    labkit.expect(counters["spec_decode_num_accepted_tokens"] > 0,
                  "some of your proposer's guesses were accepted (the model repeats itself here)",
                  guesses=counters["spec_decode_num_draft_tokens"])


@labkit.points(2)
def test_engine_draft_model_greedy_outputs_equal_plain_decoding():
    spec = {"model": "mqa", "num_speculative_tokens": 4}  # a second small model guesses, with its q
    outs, engine = speculative_outputs(spec, with_proposer=False)
    counters = engine.counters
    plain = plain_outputs()
    for prompt, got, want in zip(PROMPTS, outs, plain):
        labkit.expect(got == want, "greedy outputs through the engine with a draft model and your verifier "
                      "equal plain decoding's", prompt=prompt, plain=want, speculative=got)
    labkit.expect(counters["spec_decode_num_accepted_tokens"] > 0, "some of the draft's guesses were accepted",
                  guesses=counters["spec_decode_num_draft_tokens"])
