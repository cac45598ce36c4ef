"""The capstone's workload and deployment runner, on the embedded target model."""
import numpy as np
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
                                        ({"scheduler_policy": "fifo"}, "scheduler_policy"), ({"max_num_seqs": 0}, "max_num_seqs"),
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
    for name, dep in {"continuous": {"scheduler_policy": "continuous"},
                      "prefix": {"scheduler_policy": "continuous", "enable_prefix_caching": True},
                      "int8": {"scheduler_policy": "continuous", "enable_prefix_caching": True, "quantization": "int8"},
                      "cache": {"scheduler_policy": "continuous", "enable_prefix_caching": True,
                                "semantic_cache_threshold": 0.65},
                      "spec": {"scheduler_policy": "continuous", "enable_prefix_caching": True,
                               "speculative": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}},
                      }.items():
        out[name] = C.serve(dep, workload, models, reference=ref)
    return out


def test_each_step_does_what_it_should(runs):
    s, c, p, q, k = (runs[n] for n in ("static", "continuous", "prefix", "int8", "cache"))
    n = len(runs["workload"])
    assert s["generated_tokens"] == c["generated_tokens"] == sum(w["max_tokens"] for w in runs["workload"])
    # continuous batching: fewer steps, lower TTFT, the same tokens
    assert c["engine_steps"] < s["engine_steps"] and c["ttft_steps_p99"] < s["ttft_steps_p99"]
    assert c["agreement"] == 1.0
    # prefix caching shares the system prompt's blocks: same schedule, a smaller peak
    assert p["engine_steps"] == c["engine_steps"] and p["kv_peak_blocks"] < c["kv_peak_blocks"]
    assert p["kv_peak_bytes"] < p["kv_contiguous_bytes"]
    # int8 halves the bytes per step and changes a few tokens
    assert q["cost"] == pytest.approx(p["cost"] / 2) and 0.8 < q["agreement"] < 1.0
    # the cache answers some requests without the engine: no step, TTFT 0
    assert k["cache_hits"] > 0 and k["by"]["cache"] + k["by"]["large"] == n
    assert k["engine_steps"] < p["engine_steps"] and k["generated_tokens"] < p["generated_tokens"]
    assert k["ttft_steps_p50"] <= p["ttft_steps_p50"]
    assert all(r["tpot_steps_p50"] >= 1 for r in (s, c, p, q)) and c["ttft_steps_p50"] >= 1
    # n-gram speculation: the same greedy tokens in fewer steps, some guesses kept
    sp = runs["spec"]
    assert sp["generated_tokens"] == p["generated_tokens"] and sp["agreement"] > 0.95
    assert 0 < sp["spec_acceptance"] < 1 and sp["engine_steps"] < p["engine_steps"] and sp["tpot_steps_p50"] < 1
    assert p["spec_acceptance"] is None


def test_router_sends_requests_to_the_draft(runs):
    workload = runs["workload"]
    r = C.serve({"scheduler_policy": "continuous", "router_threshold": 100.0}, workload, C.Models(device="cpu"),
                reference=runs["static"]["tokens"])
    assert r["by"]["small"] == len(workload) and r["steps"]["large"] == 0
    assert r["cost"] < 0.25 * runs["continuous"]["cost"]          # the draft reads ~1/6 of the bytes per step
    assert r["agreement"] < 0.5


@pytest.mark.slow
@pytest.mark.parametrize("dep", [C.reference_deployment(),
                                 {"scheduler_policy": "continuous", "max_num_seqs": 16, "enable_prefix_caching": True,
                                  "quantization": "int8"},
                                 {"scheduler_policy": "continuous", "max_num_seqs": 16, "enable_prefix_caching": True,
                                  "semantic_cache_threshold": 0.7}])
def test_lab_target_has_several_answers(dep):
    workload = customer_workload(**C.LAB_WORKLOAD)
    models = C.Models(device="cpu")
    ref = C.serve({"scheduler_policy": "continuous", "max_num_seqs": 16}, workload, models)["tokens"]
    r = C.serve(dep, workload, models, reference=ref)
    T = C.LAB_TARGET
    assert r["ttft_steps_p99"] <= T["ttft_steps_p99"] and r["kv_peak_blocks"] <= T["kv_peak_blocks"]
    assert r["cost"] <= T["cost"] and r["agreement"] >= T["agreement"] and r["wrong_answers"] <= T["wrong_answers"]
