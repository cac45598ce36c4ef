"""``inferlab bench spec`` reports every field of its table, with outputs identical to plain decoding."""
from __future__ import annotations

import pytest

from inferlab.bench import spec


@pytest.mark.slow
def test_bench_spec_small_run():
    res = spec.run(ks=(2,), num_prompts=1, prompt_tokens=32, new_tokens=8, repeats=1)
    assert res["baseline_tokens_per_s"] > 0
    assert [(r["method"], r["num_speculative_tokens"]) for r in res["methods"]] == [("ngram", 2), ("draft", 2),
                                                                                   ("medusa", 2)]
    for r in res["methods"]:
        assert r["outputs_identical"] is True
        assert 0 <= r["acceptance_rate"] <= 1 and 1 <= r["mean_acceptance_length"] <= 3
        assert r["verify_cost_ratio"] > 0 and r["predicted_speedup"] > 0
    assert res["methods"][1]["draft_cost_ratio"] > 0 and 0 < res["methods"][2]["draft_cost_ratio"] < 1


def test_engine_table_small_run():
    """The engine's batch table: every row's outputs equal the engine without speculation, the
    counters give an acceptance rate in [0, 1], and accepted guesses save verify steps."""
    from inferlab.model.loader import load_checkpoint

    model, tok = load_checkpoint("target", device="cpu")
    heads = (spec.heads_folder_for("target"), 4)
    rows = spec.engine_table(model, tok, ks=(2, 5), batch_sizes=(1, 2), prompt_tokens=32, new_tokens=8, repeats=1,
                             methods=("ngram", "draft", "medusa"), medusa=heads)
    assert [(r["batch_size"], r["method"], r["num_speculative_tokens"]) for r in rows] == [
        (b, m, k) for b in (1, 2) for m in ("ngram", "draft", "medusa") for k in (2, 5) if (m, k) != ("medusa", 5)]
    for r in rows:
        assert r["outputs_identical"] is True
        assert 0 <= r["acceptance_rate"] <= 1 and 1 <= r["mean_acceptance_length"] <= 1 + r["num_speculative_tokens"]
        assert r["tokens_per_s"] > 0 and r["baseline_tokens_per_s"] > 0 and r["engine"]["measured_decode_speedup"] > 0
        assert r["verify_cost_ratio"] > 0 and r["predicted_speedup"] > 0
        assert (r["draft_cost_ratio"] == 0) == (r["method"] == "ngram")
        assert r["alpha"] >= r["acceptance_rate"] - 1e-9  # per-position a is never below the share kept
    assert rows[0]["steps"] < rows[0]["baseline_steps"] == 8
    # no proposer that copies from the context beats the ceiling: prompt lookup's steps saved stay under it
    for r in (r for r in rows if r["method"] == "ngram" and r["batch_size"] == 1):
        assert 1 <= r["baseline_steps"] / r["steps"] <= r["copy_ceiling"], r
    # batch 1: the share of steps with guesses, from the counters, is the one the step profile counted
    for r in (r for r in rows if r["batch_size"] == 1):
        assert r["share_of_steps_with_guesses"] == pytest.approx(r["engine"]["share_of_steps_with_guesses"]), r["method"]
    assert all(r["acceptance_rate"] > 0 for r in rows if r["method"] == "medusa")


@pytest.mark.slow
def test_bench_spec_json_has_medusa_rows(capsys):
    """``inferlab bench spec --json``: medusa rows in both tables, with every field of the formula."""
    import json

    assert spec.main(["--k", "2", "--prompts", "1", "--new-tokens", "24", "--repeats", "1", "--batch-sizes", "1",
                      "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    (row,) = [r for r in res["methods"] if r["method"] == "medusa"]
    assert row["num_speculative_tokens"] == 2 and row["outputs_identical"] is True
    assert 0 < row["draft_cost_ratio"] < 1 and row["verify_cost_ratio"] > 0
    assert row["acceptance_rate"] > 0 and row["predicted_speedup"] > 0 and row["speedup"] > 0
    (erow,) = [r for r in res["engine"] if r["method"] == "medusa"]
    assert erow["batch_size"] == 1 and erow["outputs_identical"] is True and erow["acceptance_rate"] > 0


def test_engine_table_on_chat_prompts_runs_every_prompt_at_each_batch_size(toy_eagle_folder):
    """A chat set (``spec_prompts.json`` through the template): every batch size runs all the
    prompts, the answers stop at the end of the turn, EAGLE's c is measured, outputs match."""
    from inferlab.model.chat import Chat
    from inferlab.model.loader import load_checkpoint
    from inferlab.sampling import SamplingParams

    model, tok = load_checkpoint("target", device="cpu")
    prompts = spec.chat_prompts(tok, "grounded", 3)
    params = Chat(tok).sampling_params(SamplingParams(temperature=0, max_tokens=8))
    rows = spec.engine_table(model, tok, ks=(2,), batch_sizes=(1, 2), prompt_tokens=32, repeats=1,
                             methods=("ngram", "eagle"), eagle=str(toy_eagle_folder), prompts=prompts, params=params)
    assert [(r["batch_size"], r["method"]) for r in rows] == [(1, "ngram"), (1, "eagle"), (2, "ngram"), (2, "eagle")]
    for r in rows:
        assert r["outputs_identical"] is True and r["baseline_steps"] >= 3 * 8 // r["batch_size"] - 1
    assert all(0 < r["draft_cost_ratio"] < 1 for r in rows if r["method"] == "eagle")
    # without the module-path timings, only the engine's own terms
    (row,) = spec.engine_table(model, tok, ks=(2,), batch_sizes=(2,), repeats=1, methods=("ngram",),
                               prompts=prompts, params=params, module_costs=False)
    assert row["verify_cost_ratio"] is row["draft_cost_ratio"] is row["predicted_speedup"] is None
    assert row["outputs_identical"] is True and row["engine"]["verify_cost_ratio"] > 0
    with pytest.raises(Exception, match="unknown prompt set"):
        spec.chat_prompts(tok, "about")


def test_runs_side_by_side_move_through_the_answers_together(monkeypatch):
    """The engine behind in tokens emitted takes the next step: plain decoding takes a step for each
    token where prompt lookup emits several, so neither run's steps bunch up where a burst of other
    work could land on them alone (a step each in turn leaves plain decoding's extra steps to the end)."""
    from inferlab.engine.llm_engine import LLMEngine
    from inferlab.model.loader import load_checkpoint
    from inferlab.sampling import SamplingParams

    model, tok = load_checkpoint("target", device="cpu")
    prompts = spec.held_out_prompts(tok, 2, 48)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    engines, order, real_step = {}, [], LLMEngine.step

    def step(self):
        live = [e for e in engines.values() if e.has_unfinished_requests()]
        order.append((self.counters["num_generation_tokens"], min(e.counters["num_generation_tokens"] for e in live)))
        return real_step(self)

    real_init = LLMEngine.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        engines[len(engines)] = self

    monkeypatch.setattr(LLMEngine, "step", step)
    monkeypatch.setattr(LLMEngine, "__init__", init)
    runs = spec._engine_runs(model, tok, prompts, params,
                             {None: None, "ngram": {"method": "ngram", "num_speculative_tokens": 4}}, 1)
    assert runs[None][2]["num_steps"] > runs["ngram"][2]["num_steps"]  # prompt lookup saved steps here
    assert runs[None][1] == runs["ngram"][1]
    assert all(mine == least for mine, least in order), order  # never a step by a run ahead of another


def test_the_median_repeat_is_kept():
    """A stalled step moves the repeat it lands in, not the median the table keeps."""
    class Prof:
        def __init__(self, s):
            self.s = s

        def decode_seconds(self):
            return self.s

    pair = lambda plain, run: ((run, None, None, Prof(run)), (plain, None, None, Prof(plain)))  # noqa: E731
    fast, stalled_plain, slow = pair(1.2, 1.0), pair(3.0, 1.0), pair(1.0, 1.0)
    assert spec._median_repeat([stalled_plain, fast, slow]) is fast
    assert spec._median_repeat([stalled_plain, slow]) is slow  # of two, the lower
    assert spec._median_repeat([fast]) is fast


@pytest.mark.parametrize("k, c, v", [(2, 0.0, 1.0), (4, 0.05, 1.1), (3, 0.2, 1.3)])
def test_needed_alpha_reaches_the_goal_exactly(k, c, v):
    from inferlab.spec.rejection import predicted_speedup

    a = spec.needed_alpha(1.5, k, c, v)
    assert a is not None and abs(predicted_speedup(a, k, c, v) - 1.5) < 1e-6
    assert predicted_speedup(a - 0.01, k, c, v) < 1.5
    assert spec.needed_alpha(k + 2.0, k, c, v) is None  # more than k + 1 tokens per step: never


def test_goal_verdict_names_the_best_allowed_method():
    rows = [{"batch_size": 1, "method": "ngram", "num_speculative_tokens": 2, "speedup": 3.0, "predicted_speedup": 3.2,
             "alpha": 0.9, "draft_cost_ratio": 0.0, "verify_cost_ratio": 1.0, "engine": {"measured_decode_speedup": 3.3},
             "copy_ceiling": 3.1},
            {"batch_size": 1, "method": "eagle", "num_speculative_tokens": 4, "speedup": 1.2, "predicted_speedup": 1.5,
             "alpha": 0.4, "draft_cost_ratio": 0.05, "verify_cost_ratio": 1.05, "engine": {"measured_decode_speedup": 1.3},
             "copy_ceiling": 2.0},
            {"batch_size": 4, "method": "eagle", "num_speculative_tokens": 4, "speedup": 2.0, "predicted_speedup": 2.0,
             "alpha": 0.7, "draft_cost_ratio": 0.05, "verify_cost_ratio": 1.05, "engine": {"measured_decode_speedup": 2.1},
             "copy_ceiling": 2.0}]
    grounded = spec.goal_verdict(rows, "grounded")
    assert grounded["method"] == "ngram" and grounded["met"] and grounded["decode_speedup"] == 3.3
    assert grounded["copy_ceiling"] == 3.1
    free = spec.goal_verdict(rows, "free")  # n-gram does not count there, nor batch 4
    assert free["method"] == "eagle" and not free["met"] and free["needed_alpha"] > free["alpha"]
    assert abs(free["delivered_share_of_prediction"] - 0.8) < 1e-9


def test_engine_table_passes_its_confidence_threshold_to_the_model_proposers():
    """A threshold reaches the draft (fewer, likelier guesses: a higher share kept), never prompt lookup."""
    from inferlab.model.loader import load_checkpoint

    model, tok = load_checkpoint("target", device="cpu")
    rows = {t: spec.engine_table(model, tok, ks=(3,), batch_sizes=(1,), prompt_tokens=32, new_tokens=16, repeats=1,
                                 methods=("ngram", "draft"), module_costs=False, confidence_threshold=t)
            for t in (0.0, 0.5)}
    (ngram0, draft0), (ngram1, draft1) = rows[0.0], rows[0.5]
    assert (ngram1["confidence_threshold"], draft1["confidence_threshold"]) == (0.0, 0.5)
    assert ngram1["acceptance_rate"] == ngram0["acceptance_rate"]
    assert draft1["acceptance_rate"] > draft0["acceptance_rate"] and draft1["outputs_identical"] is True


def test_costs_time_the_forward_the_engine_runs(monkeypatch, toy_eagle_folder):
    """c and v of the engine table are timed on the engine's path: a verify of one pool runs the
    layers in one C call and gives the logits the module path gives, its step functions share one
    layer plan,
    and EAGLE's pass runs its layer in C too."""
    import torch

    from inferlab import native
    from inferlab.model import decode_layers
    from inferlab.model.loader import load_checkpoint
    from inferlab.spec.eagle import load_eagle

    if not native.loops_run():
        pytest.skip("the C loops do not run in this process")
    model, _ = load_checkpoint("target", device="cpu")
    pool = spec.PagedPool(model, 24, 2)
    verify, one = spec.forward_step(model, 4, 24, pool=pool), spec.forward_step(model, 1, 24, pool=pool)
    ran, built = [], []
    real_run, real_plan = decode_layers.run, decode_layers._Plan
    monkeypatch.setattr(decode_layers, "run", lambda *a, **k: ran.append(real_run(*a, **k)) or ran[-1])
    monkeypatch.setattr(decode_layers, "_Plan", lambda *a: built.append(1) or real_plan(*a))
    for _ in range(2):
        rows, _ = verify(), one()
    assert ran and all(ran) and not built, (ran, built)
    assert rows.shape == (4, model.config.vocab_size)
    torch.testing.assert_close(rows[-1], spec.forward_step(model, 4, 24)()[0, -1], rtol=1e-4, atol=1e-4)
    eagle = load_eagle(toy_eagle_folder, model.config, model.device, model.dtype)
    ran.clear()
    assert spec.eagle_step(eagle, model, 24)().shape == (1,)
    assert ran and all(ran), ran  # its prefill and the pass
