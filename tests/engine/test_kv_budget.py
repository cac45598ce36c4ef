"""The same-KV-memory comparison (``inferlab bench serve``, kv_budget.py): what each reservation
admits, the ShareGPT-shaped workload's lengths, and the report on the embedded model."""
from __future__ import annotations

import json
import statistics

import pytest

from inferlab.bench.kv_budget import (SHAREGPT, default_budget_tokens, make_sharegpt_workload, reservation,
                                      sharegpt_lengths, static_batches)
from inferlab.bench.stats import step_split
from inferlab.cli import main


def test_reservations_max_and_pow2():
    assert [reservation(n, "max", 256) for n in (1, 62, 256)] == [256, 256, 256]
    assert [reservation(n, "pow2", 256) for n in (1, 2, 3, 16, 17, 62, 64, 65, 129, 256)] == \
        [1, 2, 4, 16, 32, 64, 64, 128, 256, 256]
    with pytest.raises(ValueError, match="unknown reservation scheme"):
        reservation(10, "oracle", 256)


def test_how_many_sequences_fit_the_budget():
    """1024 tokens: Orca-Max fits 1024 // 256 = 4 per batch whatever the lengths; Orca-Pow2 packs
    by each request's power of two (62 -> 64, 100 -> 128, 30 -> 32, 200 -> 256), FIFO, a batch
    closing at the first request that does not fit."""
    lengths = [62, 100, 30, 200, 62, 62, 200, 200, 200, 30]
    assert static_batches(lengths, "max", 1024, 256) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    # pow2: 64+128+32+256+64+64+256 = 864, +256 > 1024; then 256+256+32
    assert static_batches(lengths, "pow2", 1024, 256) == [[0, 1, 2, 3, 4, 5, 6], [7, 8, 9]]
    assert static_batches([64] * 40, "pow2", 1024, 256) == [list(range(16)), list(range(16, 32)), list(range(32, 40))]
    assert default_budget_tokens() == 1024  # 16 sequences of the mean 62 tokens, in 4 blocks each
    with pytest.raises(ValueError, match="exceeds the KV budget"):
        static_batches([10], "max", 128, 256)


def test_sharegpt_lengths_scaled_means_and_tail():
    a = sharegpt_lengths(4000, seed=5)
    assert a == sharegpt_lengths(4000, seed=5) and a != sharegpt_lengths(4000, seed=6)
    prompts, outputs = [p for p, _ in a], [o for _, o in a]
    assert statistics.fmean(prompts) == pytest.approx(SHAREGPT["input_mean"] / 8, rel=0.1)   # 20
    assert statistics.fmean(outputs) == pytest.approx(SHAREGPT["output_mean"] / 8, rel=0.1)  # 42
    assert max(p + o for p, o in a) <= SHAREGPT["max_len"] // 8 and min(outputs) >= 1
    assert statistics.median(outputs) < 0.75 * statistics.fmean(outputs)  # long-tailed
    assert sorted(outputs)[int(0.99 * len(outputs))] > 4 * statistics.median(outputs)


def test_workload_prompts_are_english_windows_of_the_drawn_length(target):
    _, tok = target
    w = make_sharegpt_workload(tok, 50, seed=2)
    assert [(len(r["prompt"]), r["max_tokens"]) for r in w] == sharegpt_lengths(50, seed=2)
    assert " the " in tok.decode(max(w, key=lambda r: len(r["prompt"]))["prompt"])


def test_bench_serve_same_memory_report(capsys, monkeypatch):
    """On the embedded model, a tiny workload, a 512-token budget given in MB (3072 B per token):
    every system completes every request, Orca-Max fits 2, every engine runs the weights
    ``--quantization`` asks for, and the report says what it measured."""
    import inferlab.bench.kv_budget as kv_budget

    built = []

    class Recording(kv_budget.LLM):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            built.append(type(self.model.model.layers[0].self_attn.o_proj).__name__)

    monkeypatch.setattr(kv_budget, "LLM", Recording)
    args = ["bench", "serve", "--model", "target", "--compare", "memory", "--memory-requests", "5", "--repeats", "1",
            "--kv-budget-mb", "1.572864"]
    assert main(args + ["--json", "--quantization", "int8"]) == 0
    m = json.loads(capsys.readouterr().out)["same_memory"]
    assert m["quantization"] == "int8" and len(built) == 3 and all("Int8" in name for name in built), built
    assert m["kv_budget_tokens"] == 512 and m["max_sequences_orca_max"] == 2 and m["kv_bytes_per_token"] == 3072
    assert set(m["systems"]) == {"Orca-Max", "Orca-Pow2", "vLLM"}
    want = sum(o for _, o in sharegpt_lengths(5))
    for x in m["systems"].values():
        assert x["requests"] == 5 and x["output_tokens"] == want and x["output_tokens_per_s"] > 0
        assert x["mean_batch"] >= 1 and "records" not in x
    assert m["systems"]["Orca-Max"]["max_batch_formed"] == 2
    v = m["systems"]["vLLM"]
    assert m["vllm_over_orca_max"] == v["over_Orca-Max"] == pytest.approx(
        v["output_tokens_per_s"] / m["systems"]["Orca-Max"]["output_tokens_per_s"], rel=1e-2)
    assert m["goal_met"] == (m["vllm_over_orca_max"] >= 3.0)
    # Static batches never preempt: they compute each prompt once; vLLM recomputes what it preempted
    prompts = m["workload"]["prompt_tokens"]
    assert m["systems"]["Orca-Max"]["prompt_tokens_computed"] == m["systems"]["Orca-Pow2"]["prompt_tokens_computed"] == prompts
    assert v["prompt_tokens_computed"] >= prompts and (v["preemptions"] > 0) == (v["prompt_tokens_computed"] > prompts)
    for x in m["systems"].values():
        assert 0 < x["prompt_share"] < 1 and x["decode_tokens_per_s"] > 0
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "ShareGPT lengths divided by 8" in out and "Orca-Pow2" in out and "weights as stored" in out
    assert "steps with a prompt:" in out and "decode steps alone: vLLM" in out
    assert "goal vLLM / Orca-Max tokens/s >= 3.0:" in out and ("met" in out or "MISSED" in out)


def test_step_split_counts_prompt_steps_and_decode_rows():
    """A prompt step (with a decode beside it) counts its prompt rows and its time on the prompt
    side; decode-only steps give tokens/s as sequences per step over their time."""
    d = {"kind": "decode", "num_new_tokens": 1}
    records = [{"scheduled": [{"kind": "prefill", "num_new_tokens": 7}, d], "seconds": 0.5},
               {"scheduled": [d, d, d], "seconds": 0.25},
               {"scheduled": [{"kind": "prefill", "num_new_tokens": 3, "chunk": True}], "seconds": 0.25},
               {"scheduled": [d], "seconds": 0.5}]
    split = step_split(records)
    assert split["prompt_step_s"] == 0.75 and split["decode_step_s"] == 0.75 and split["prompt_share"] == 0.5
    assert split["prompt_tokens_computed"] == 10 and split["decode_tokens_per_s"] == 4 / 0.75
