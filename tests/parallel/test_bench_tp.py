"""``inferlab bench tp``: the counts it reports are the ones the sharding implies."""
from __future__ import annotations

import json

import pytest


@pytest.mark.slow  # one TP launch and three loads in fresh interpreters: ~25 s
def test_bench_tp_json(capsys):
    from inferlab.bench.tp import main
    assert main(["--model", "mqa", "--batch", "2", "--context", "8", "--new-tokens", "4", "--repeats", "1",
                 "--memory-model", "mqa", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    tp1, tp2 = r["rows"]
    assert (tp1["tensor_parallel_size"], tp2["tensor_parallel_size"]) == (1, 2)
    assert tp1["all_reduces_per_step"] == 0
    # attention + MLP of each layer, and the embedding; one all-gather for the logits
    assert tp2["all_reduces_per_step"] == r["expected_all_reduces_per_step"] == 2 * 2 + 1
    assert tp2["all_gathers_per_step"] == 1
    assert tp2["bytes_per_all_reduce"] == 2 * 128 * 4  # batch x hidden x fp32 at decode
    full, rank0, rank1 = r["load_memory"]
    assert rank0["weights_mb"] < 0.6 * full["weights_mb"] and rank1["weights_mb"] == rank0["weights_mb"]
