"""The step profiler of ``bench spec``: it sorts steps as the engine ran them, leaves the engine
as it found it, and its formula is Leviathan's over a mix of steps with and without guesses."""
from __future__ import annotations

import pytest

import inferlab.engine.llm_engine as llm_engine
from inferlab.bench.step_profile import PHASES, StepProfile, engine_terms, profile_steps
from inferlab.engine.config import EngineConfig
from inferlab.engine.llm_engine import LLMEngine
from inferlab.model.loader import load_checkpoint
from inferlab.sampling import SamplingParams


@pytest.fixture(scope="module")
def pair():
    return load_checkpoint("target", device="cpu")


def _run(engine, prompt, n):
    engine.add_request("0", prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()


def test_steps_are_sorted_as_the_engine_ran_them(pair):
    model, tok = pair
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}
    engine = LLMEngine(model, tok, EngineConfig(max_num_seqs=1, speculative_config=spec))
    prompt = tok.encode("def f(x):\n    return x + 1\n\n\ndef f(x):\n    return x + 1\n\n\ndef f(")
    with profile_steps(engine) as prof:
        _run(engine, prompt, 24)
    c = engine.counters
    assert prof.steps["prefill"] == 1  # one prompt, one step
    assert prof.steps["spec"] == c["spec_decode_num_drafts"] > 0  # batch 1: a step with guesses is one draft
    assert sum(prof.steps.values()) == c["num_steps"]
    assert prof.seconds["spec"]["propose"] > 0 and prof.seconds["spec"]["forward"] > 0


def test_the_engine_is_left_as_it_was(pair):
    model, tok = pair
    spec = {"method": "ngram", "num_speculative_tokens": 2}
    engine = LLMEngine(model, tok, EngineConfig(max_num_seqs=1, speculative_config=spec))
    verify = llm_engine.verify
    with profile_steps(engine):
        pass
    assert llm_engine.verify is verify
    for owner, name in ((engine, "step"), (engine.runner, "execute"), (engine.scheduler, "schedule"),
                        (engine.proposer, "propose"), (engine.proposer, "observe")):
        assert name not in vars(owner), f"{type(owner).__name__}.{name} still wrapped"
    with profile_steps(engine) as prof:  # a second profile sees only its own steps
        _run(engine, tok.encode("x = 1\n"), 4)
    assert sum(prof.steps.values()) == engine.counters["num_steps"]


def _profile(steps: dict, forward: dict, propose: float = 0.0) -> StepProfile:
    p = StepProfile()
    for kind, n in steps.items():
        p.records[kind] += [{"forward": forward[kind], "propose": propose if kind == "spec" else 0.0} for _ in range(n)]
    return p


def test_engine_terms_price_the_mix_of_steps():
    """Plain decode: 10 steps of 0.1 s. Speculative: 3 steps with guesses (0.12 s forward,
    0.006 s proposing, 2 tokens each: L = 2) and 1 without; f = 0.75, v = 1.2, kc = 0.06,
    predicted (0.75 * 2 + 0.25) / (0.75 * 1.26 + 0.25) = 1.75 / 1.195."""
    plain = _profile({"plain": 10}, {"plain": 0.1})
    spec = _profile({"spec": 3, "plain": 1}, {"spec": 0.12, "plain": 0.1}, propose=0.006)
    counters = {"spec_decode_num_drafts": 3, "spec_decode_num_accepted_tokens": 3, "decode_tokens": 7}
    t = engine_terms(plain, spec, {"decode_tokens": 10}, counters)
    assert t["verify_cost_ratio"] == pytest.approx(1.2) and t["draft_cost_per_step"] == pytest.approx(0.06)
    assert t["share_of_steps_with_guesses"] == 0.75 and t["mean_acceptance_length"] == 2
    assert t["predicted_decode_speedup"] == pytest.approx(1.75 / 1.195)
    # 7 tokens in 0.478 s against 10 in 1.0 s
    assert t["measured_decode_speedup"] == pytest.approx((7 / 0.478) / 10)
    assert set(t["spec_step_s"]) == set(PHASES)
    # the machine ran slower during the speculative run: its step without guesses took 0.13 s, so
    # w = 1.3 prices each such step at 1.3 plain ones
    slow = _profile({"spec": 3, "plain": 1}, {"spec": 0.12, "plain": 0.13}, propose=0.006)
    t = engine_terms(plain, slow, {"decode_tokens": 10}, counters)
    assert t["plain_step_ratio"] == pytest.approx(1.3)
    assert t["predicted_decode_speedup"] == pytest.approx(1.75 / (0.75 * 1.26 + 0.25 * 1.3))


def test_a_stalled_step_counts_at_the_median():
    """A core taken mid-step by another program: one plain step of 1 s among 0.02 s ones. Counted as
    measured it would decide the comparison alone (prompt lookup read 3.2x where it saved no steps);
    at the median it does not. Steps that vary as a batch empties (2x) are kept as measured."""
    plain = _profile({"plain": 10}, {"plain": 0.02})
    plain.records["plain"][3]["forward"] = 1.0
    spec = _profile({"spec": 10}, {"spec": 0.025})
    spec.records["spec"][9]["forward"] = 0.01  # the last sequences' steps are cheaper: not a stall
    spec.records["spec"][8]["forward"] = 0.05
    counters = {"spec_decode_num_drafts": 10, "spec_decode_num_accepted_tokens": 0, "decode_tokens": 10}
    t = engine_terms(plain, spec, {"decode_tokens": 10}, counters)
    assert t["stalled_steps"] == {"plain_run": 1, "spec_run": 0}
    assert plain.decode_seconds() == pytest.approx(0.2) and plain.seconds["plain"]["forward"] == pytest.approx(1.18)
    assert spec.decode_seconds() == pytest.approx(0.025 * 8 + 0.01 + 0.05)
    assert t["measured_decode_speedup"] == pytest.approx(0.2 / 0.26)
    assert t["verify_cost_ratio"] == pytest.approx(0.026 / 0.02)
