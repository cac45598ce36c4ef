"""The capstone's workload and deployment runner, on the embedded target model."""
import pytest

from inferlab.strategy import capstone as C
from inferlab.strategy.workload import SYSTEM_PROMPT, customer_workload, peak_to_average


def test_workload_is_seeded_and_shaped():
    a = customer_workload(60, ticks=300, seed=3)
    assert a == customer_workload(60, ticks=300, seed=3) and a != customer_workload(60, ticks=300, seed=4)
    assert all(w["prompt"].startswith(SYSTEM_PROMPT) and 6 <= w["max_tokens"] <= 40 for w in a)
    ticks = [w["tick"] for w in a]
    assert ticks == sorted(ticks) and 0 <= ticks[0] and ticks[-1] < 300
    assert 2 < peak_to_average() < 3.5
    # more arrivals in the day's busy hours (8:00-18:00) than in the rest
    day = sum(8 <= w["tick"] * 24 / 300 < 18 for w in a)
    assert day > 0.7 * len(a)
    assert any(w["intent"] is None for w in a)            # near misses / out of scope are in the mix


@pytest.mark.parametrize("bad, words", [({"max_batch": 4}, "unknown switch"), ({"quantization": "int3"}, "quantization"),
                                        ({"batching_policy": "fifo"}, "batching_policy"), ({"max_num_seqs": 0}, "max_num_seqs"),
                                        ({"speculative": "ngram"}, "speculative_config must be a dict"),
                                        ({"speculative": {"model": "draft", "num_speculative_tokens": 2}}, "n-gram"),
                                        ([1], "dict")])
def test_bad_deployments_say_what_to_do(bad, words):
    with pytest.raises(ValueError, match=words):
        C.check(bad)


@pytest.fixture(scope="module")
def runs():
    workload = customer_workload(16, ticks=40, seed=1)
    models = C.Models(device="cpu")
    static = C.serve({}, workload, models)
    ref = static["tokens"]
    out = {"static": static, "workload": workload}
    for name, dep in {"continuous": {"batching_policy": "continuous"},
                      "prefix": {"batching_policy": "continuous", "enable_prefix_caching": True},
                      "int8": {"batching_policy": "continuous", "enable_prefix_caching": True, "quantization": "int8"},
                      "cache": {"batching_policy": "continuous", "enable_prefix_caching": True,
                                "semantic_cache_threshold": 0.65},
                      "spec": {"batching_policy": "continuous", "enable_prefix_caching": True,
                               "speculative": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}},
                      }.items():
        out[name] = C.serve(dep, workload, models, reference=ref)
    return out


def altered(tokens: dict) -> tuple[dict, int]:
    """A copy of a run's tokens with one token changed in the middle of the longest request, and
    the number of tokens in all."""
    out = {rid: list(t) for rid, t in tokens.items()}
    longest = max(out, key=lambda rid: len(out[rid]))
    out[longest][len(out[longest]) // 2] += 1
    return out, sum(len(t) for t in out.values())


def test_every_requested_token_is_generated(runs):
    wanted = sum(w["max_tokens"] for w in runs["workload"])
    assert runs["static"]["generated_tokens"] == runs["continuous"]["generated_tokens"] == wanted


def test_continuous_batching_takes_fewer_steps(runs):
    assert runs["continuous"]["engine_steps"] < runs["static"]["engine_steps"]


def test_continuous_batching_lowers_the_tail_ttft(runs):
    assert runs["continuous"]["ttft_steps_p99"] < runs["static"]["ttft_steps_p99"]


def test_continuous_batching_keeps_the_greedy_tokens(runs):
    assert runs["continuous"]["tokens"] == runs["static"]["tokens"] and runs["continuous"]["agreement"] == 1.0


def test_agreement_counts_tokens_at_their_positions():
    """One token changed in the middle of a reference request costs exactly one of all the
    reference's tokens (a small workload of its own: two runs)."""
    workload = customer_workload(6, ticks=12, seed=2)
    models = C.Models(device="cpu")
    dep = {"batching_policy": "continuous"}
    wrong, total = altered(C.serve(dep, workload, models)["tokens"])
    assert C.serve(dep, workload, models, reference=wrong)["agreement"] == pytest.approx(1 - 1 / total)


def test_prefix_caching_keeps_the_schedule(runs):
    assert runs["prefix"]["engine_steps"] == runs["continuous"]["engine_steps"]


def test_prefix_caching_shares_the_system_prompt_blocks(runs):
    assert runs["prefix"]["kv_peak_blocks"] < runs["continuous"]["kv_peak_blocks"]


def test_paged_kv_peak_is_below_the_contiguous_reservation(runs):
    assert runs["prefix"]["kv_peak_bytes"] < runs["prefix"]["kv_contiguous_bytes"]


def test_int8_halves_the_bytes_per_step(runs):
    assert runs["int8"]["cost"] == pytest.approx(runs["prefix"]["cost"] / 2)


def test_int8_changes_some_tokens_and_keeps_the_first_ones(runs):
    """The quantized model is another model: some greedy tokens differ from fp32's, but the
    first token of most requests, which a long shared prompt decides, does not."""
    q, ref = runs["int8"]["tokens"], runs["static"]["tokens"]
    assert q != ref and runs["int8"]["agreement"] < 1.0
    assert sum(q[rid][0] == ref[rid][0] for rid in ref) > len(ref) / 2


def test_the_cache_answers_some_requests_without_the_engine(runs):
    k = runs["cache"]
    assert k["cache_hits"] > 0 and k["by"]["cache"] + k["by"]["large"] == len(runs["workload"])


def test_cache_hits_save_steps_and_tokens(runs):
    k, p = runs["cache"], runs["prefix"]
    assert k["engine_steps"] < p["engine_steps"] and k["generated_tokens"] < p["generated_tokens"]


def test_cache_hits_do_not_raise_the_median_ttft(runs):
    assert runs["cache"]["ttft_steps_p50"] <= runs["prefix"]["ttft_steps_p50"]


def test_every_engine_request_waits_a_step_per_token(runs):
    assert all(runs[n]["tpot_steps_p50"] >= 1 for n in ("static", "continuous", "prefix", "int8"))
    assert runs["continuous"]["ttft_steps_p50"] >= 1


def test_ngram_speculation_keeps_the_greedy_tokens(runs):
    sp, p = runs["spec"], runs["prefix"]
    assert sp["generated_tokens"] == p["generated_tokens"] and sp["agreement"] > 0.95


def test_ngram_speculation_keeps_some_guesses_and_saves_steps(runs):
    sp, p = runs["spec"], runs["prefix"]
    assert 0 < sp["spec_acceptance"] < 1 and sp["engine_steps"] < p["engine_steps"] and sp["tpot_steps_p50"] < 1
    assert p["spec_acceptance"] is None


def test_router_sends_requests_to_the_draft(runs):
    workload = runs["workload"]
    r = C.serve({"batching_policy": "continuous", "router_threshold": 100.0}, workload, C.Models(device="cpu"),
                reference=runs["static"]["tokens"])
    assert r["by"]["small"] == len(workload) and r["steps"]["large"] == 0
    assert r["cost"] < 0.25 * runs["continuous"]["cost"]          # the draft reads ~1/6 of the bytes per step
    assert r["agreement"] < 0.5


@pytest.fixture(scope="module")
def lab_setting():
    return customer_workload(**C.LAB_WORKLOAD), C.Models(device="cpu", **C.LAB_MODELS)


def lab_misses(r: dict) -> list[str]:
    T = C.LAB_TARGET
    return [k for k, ok in (("ttft_steps_p99", r["ttft_steps_p99"] <= T["ttft_steps_p99"]),
                            ("kv_peak_blocks", r["kv_peak_blocks"] <= T["kv_peak_blocks"]),
                            ("cost", r["cost"] <= T["cost"]), ("grounded", r["grounded"] >= T["grounded"]),
                            ("wrong_answers", r["wrong_answers"] <= T["wrong_answers"])) if not ok]


CB = {"batching_policy": "continuous", "max_num_seqs": 12, "enable_prefix_caching": True}


@pytest.mark.slow
@pytest.mark.parametrize("dep", [C.reference_deployment(), {**CB, "quantization": "q4_k", "semantic_cache_threshold": 0.68},
                                 {**CB, "semantic_cache_threshold": 0.68,
                                  "speculative": {"method": "ngram", "num_speculative_tokens": 3}}])
def test_lab_target_has_several_answers(lab_setting, dep):
    assert lab_misses(C.serve(dep, *lab_setting)) == []


@pytest.mark.slow
@pytest.mark.parametrize("dep, missed", [({**CB}, "grounded"),                          # smollm2 alone grounds too few
                                         ({**CB, "semantic_cache_threshold": 0.5}, "wrong_answers"),
                                         ({**CB, "quantization": "int8", "semantic_cache_threshold": 0.68}, "cost"),
                                         ({"enable_prefix_caching": True, "semantic_cache_threshold": 0.68}, "ttft_steps_p99"),
                                         ({"batching_policy": "continuous", "max_num_seqs": 12,
                                           "semantic_cache_threshold": 0.68}, "kv_peak_blocks")])
def test_lab_target_each_part_binds(lab_setting, dep, missed):
    """Each part of the target is missed by a deployment that leaves out the technique it asks for
    (without the cache, more requests queue for the engine: TTFT and KV miss too)."""
    assert missed in lab_misses(C.serve(dep, *lab_setting))