"""Quantized linears shard: INT8 per channel, INT4 by whole groups; what cannot shard says why.

TP=2 runs with ``INFERLAB_QUANT_KERNEL=eager`` (dequantize-then-matmul): the CPU's W8A8 fast path
quantizes each row of the activations with its own absmax scale, and a row-parallel rank sees only
half of that row, so its scale differs from TP=1's by design (vLLM's dynamic W8A8 does the same)."""
from __future__ import annotations

import pytest
import torch

from inferlab import LLM
from inferlab.engine.model_runner import SeqInput
from inferlab.model.loader import load_checkpoint
from inferlab.parallel import TensorParallelError
from inferlab.parallel.loader import load_shard

from .test_tp_engine import PROMPT


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from inferlab.quant import quantize_model
    from inferlab.quant.checkpoint import save_quantized
    out = {}
    for method, group in (("int8", None), ("int4", 64), ("int4-g128", 128), ("nf4", 64)):
        model, tok = load_checkpoint("mqa", device="cpu", dtype=torch.float32)
        qcfg = quantize_model(model, method.split("-")[0], group_size=group, progress=False)
        out[method] = save_quantized(model, tok, tmp_path_factory.mktemp(method) / "m", qcfg)
    return out


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_shards_are_slices_of_the_full_buffers(folders, method):
    full = load_checkpoint(folders[method], device="cpu")[0].state_dict()
    parts = [load_shard(folders[method], r, 2, device="cpu")[0].state_dict() for r in range(2)]
    o = "model.layers.1.self_attn.o_proj"   # row-parallel: codes and group scales by input column
    for buf in ("qweight",) + (("scales", "zeros") if method == "int4" else ()):
        torch.testing.assert_close(torch.cat([p[f"{o}.{buf}"] for p in parts], dim=1), full[f"{o}.{buf}"], rtol=0, atol=0)
    if method == "int8":  # one scale per output row: whole on every rank
        for p in parts:
            torch.testing.assert_close(p[f"{o}.scales"], full[f"{o}.scales"], rtol=0, atol=0)
    up = "model.layers.1.mlp.up_proj"      # column-parallel: whole rows
    for buf in ("qweight", "scales"):
        torch.testing.assert_close(torch.cat([p[f"{up}.{buf}"] for p in parts]), full[f"{up}.{buf}"], rtol=0, atol=0)


def test_a_group_cut_across_ranks_is_refused(folders):
    """o_proj has 128 inputs: 64 per rank cannot hold a whole group of 128."""
    with pytest.raises(TensorParallelError, match="cut a quantization group"):
        load_shard(folders["int4-g128"], 0, 2, device="cpu")


def test_block_formats_are_refused(folders):
    with pytest.raises(TensorParallelError, match="only int8 and int4 folders shard"):
        load_shard(folders["nf4"], 0, 2, device="cpu")


def test_quantize_at_load_is_refused():
    with pytest.raises(TensorParallelError, match="write a quantized folder first"):
        LLM("mqa", device="cpu", quantization="int8", tensor_parallel_size=2)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_tp2_logits_equal_tp1(folders, method, monkeypatch):
    monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "eager")  # before the worker starts: it inherits it
    knobs = dict(device="cpu", dtype="float32", num_kv_blocks=8, max_num_seqs=2)
    tp1, tp2 = LLM(str(folders[method]), **knobs), LLM(str(folders[method]), tensor_parallel_size=2, **knobs)
    try:
        assert type(tp2.model.model.layers[0].self_attn.o_proj).__name__ == ("Int8Linear" if method == "int8" else "Int4Linear")
        seqs = [SeqInput(list(PROMPT), 0, [1, 2])]
        ref = tp1.llm_engine.runner.execute(seqs, all_logits=True)[0]
        got = tp2.llm_engine.runner.execute(seqs, all_logits=True)[0]
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    finally:
        tp2.shutdown()
