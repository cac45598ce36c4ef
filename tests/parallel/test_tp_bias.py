"""Biases under tensor parallelism: a column-parallel layer keeps its slice of the bias, a
row-parallel one adds the whole bias once, after the all-reduce (added before it, N ranks would add
it N times). A Llama with attention and MLP biases (q/k/v/o and gate/up/down) checks both."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inferlab.engine.model_runner import SeqInput
from inferlab.model.loader import load_checkpoint
from inferlab.parallel.layers import column_parallel_forward, row_parallel_forward
from inferlab.parallel.loader import load_shard


def test_row_parallel_forward_adds_the_bias_once():
    """Two ranks in one process: each all-reduce adds the other rank's partial sum."""
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(3, 8, generator=g), torch.randn(5, 8, generator=g), torch.randn(5, generator=g)
    xs, ws = x.chunk(2, dim=-1), w.chunk(2, dim=-1)
    for r in range(2):
        other = F.linear(xs[1 - r], ws[1 - r])
        y = row_parallel_forward(xs[r], ws[r], b, all_reduce=lambda t: t + other)
        torch.testing.assert_close(y, F.linear(x, w, b))


def test_column_parallel_forward_uses_its_slice_of_the_bias():
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(3, 8, generator=g), torch.randn(6, 8, generator=g), torch.randn(6, generator=g)
    y = torch.cat([column_parallel_forward(x, wr, br) for wr, br in zip(w.chunk(2), b.chunk(2))], dim=-1)
    torch.testing.assert_close(y, F.linear(x, w, b))


@pytest.fixture(scope="module")
def biased(tmp_path_factory):
    pytest.importorskip("transformers")
    from core.checkpoints import save_variant

    folder = tmp_path_factory.mktemp("llama_bias")
    save_variant("llama_bias", folder)
    return folder


def test_each_rank_holds_its_bias_slice_and_the_whole_row_bias(biased):
    full = load_checkpoint(biased, device="cpu", dtype=torch.float32)[0].state_dict()
    parts = [load_shard(biased, r, 2, device="cpu", dtype=torch.float32)[0].state_dict() for r in range(2)]
    key = "model.layers.0.self_attn.q_proj.bias"
    torch.testing.assert_close(torch.cat([p[key] for p in parts]), full[key], rtol=0, atol=0)
    for key in ("model.layers.0.self_attn.o_proj.bias", "model.layers.0.mlp.down_proj.bias"):
        for p in parts:
            torch.testing.assert_close(p[key], full[key], rtol=0, atol=0)


def test_biased_model_on_two_ranks_matches_tp1(biased):
    from inferlab import LLM

    llm = LLM(str(biased), device="cpu", dtype="float32", tensor_parallel_size=2, num_kv_blocks=8, max_num_seqs=2)
    try:
        full = load_checkpoint(biased, device="cpu", dtype=torch.float32)[0]
        ids = [5, 77, 31, 12, 40, 9, 64, 102, 7, 3, 25, 18, 99, 48, 33, 1, 60, 42]  # 18 tokens: 2 blocks
        got = llm.llm_engine.runner.execute([SeqInput(ids, 0, [0, 1])], all_logits=True)[0]
        with torch.inference_mode():
            want = full(torch.tensor([ids]))[0]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    finally:
        llm.shutdown()
