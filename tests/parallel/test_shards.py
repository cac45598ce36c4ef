"""Each rank's shard is the right slice of the full checkpoint (no processes needed: loading only
needs the rank and the world size), and what cannot shard says so."""
from __future__ import annotations

import shutil

import pytest
import torch

from inferlab.model.loader import load_checkpoint
from inferlab.parallel import TensorParallelError
from inferlab.parallel.loader import load_shard


def shards(name, world=2):
    return [load_shard(name, r, world, device="cpu", dtype=torch.float32)[0] for r in range(world)]


@pytest.mark.parametrize("name", ["target", "mqa", "moe"])
def test_shards_concatenate_to_the_full_weights(name):
    full = load_checkpoint(name, device="cpu", dtype=torch.float32)[0].state_dict()
    parts = [m.state_dict() for m in shards(name)]
    cfg = load_checkpoint(name, device="cpu")[0].config
    for key, w in full.items():
        if key.endswith((".q_proj.weight", ".gate_proj.weight", ".up_proj.weight", ".w1.weight", ".w3.weight",
                         "embed_tokens.weight", "lm_head.weight")):
            torch.testing.assert_close(torch.cat([p[key] for p in parts]), w, rtol=0, atol=0)
        elif key.endswith((".o_proj.weight", ".down_proj.weight", ".w2.weight")):
            torch.testing.assert_close(torch.cat([p[key] for p in parts], dim=1), w, rtol=0, atol=0)
        elif key.endswith((".k_proj.weight", ".v_proj.weight")):
            if cfg.num_key_value_heads < 2:  # one KV head, replicated on both ranks
                for p in parts:
                    torch.testing.assert_close(p[key], w, rtol=0, atol=0)
            else:
                torch.testing.assert_close(torch.cat([p[key] for p in parts]), w, rtol=0, atol=0)
        else:  # norms, the router
            for p in parts:
                torch.testing.assert_close(p[key], w, rtol=0, atol=0)


def test_tied_embedding_stays_one_tensor_per_rank():
    for m in shards("target"):
        assert m.lm_head.weight is m.model.embed_tokens.weight
        assert m.lm_head.weight.shape[0] == m.config.vocab_size // 2


def test_local_head_counts():
    for name, heads, kv in (("target", 4, 1), ("mqa", 2, 1)):
        for m in shards(name):
            attn = m.model.layers[0].self_attn
            assert (attn.n_heads, attn.n_kv) == (heads, kv)


def test_indivisible_heads_are_refused():
    with pytest.raises(TensorParallelError, match="num_attention_heads .* not divisible by tensor_parallel_size=3"):
        load_shard("target", 0, 3, device="cpu")


def test_wrong_full_shape_is_caught_before_cutting(tmp_path):
    from safetensors.torch import load_file, save_file
    from inferlab.errors import CheckpointError
    from inferlab.model.loader import ASSETS
    folder = tmp_path / "bad"
    shutil.copytree(ASSETS / "mqa", folder)
    tensors = load_file(folder / "model.safetensors")
    key = "model.layers.0.self_attn.q_proj.weight"
    tensors[key] = torch.cat([tensors[key], tensors[key][:64]])  # 2 heads too many: each rank's cut would fit
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="q_proj.weight has shape"):
        load_shard(folder, 0, 2, device="cpu")


def test_each_rank_packs_its_own_shards():
    """Packing runs after loading, so a rank stacks its q/k/v (gate/up) slices into one GEMM."""
    from inferlab.model.packing import pack_projections
    for m in shards("target"):
        attn = m.model.layers[0].self_attn
        x = torch.randn(1, 4, m.config.hidden_size)
        before = (attn.q_proj(x), attn.k_proj(x), attn.v_proj(x))
        assert pack_projections(m) == 2 * m.config.num_hidden_layers
        fused = attn.packed_qkv.fused
        assert fused.weight.shape[0] == (4 + 1 + 1) * m.config.head_dim  # this rank's 4 q heads, 1 k, 1 v
        for a, b in zip(attn.packed_qkv(x), before):
            torch.testing.assert_close(a, b)


def test_fewer_kv_heads_than_ranks_replicates_the_head_each_rank_reads():
    """target on 4 ranks: 8 query heads, 2 KV heads. Ranks 0-1 hold query heads 0-3, which read KV
    head 0; ranks 2-3 hold query heads 4-7, which read KV head 1 (GQA: query head h reads h // 4)."""
    full = load_checkpoint("target", device="cpu", dtype=torch.float32)[0]
    hd, group = full.config.head_dim, full.config.num_attention_heads // full.config.num_key_value_heads
    k_full = full.model.layers[1].self_attn.k_proj.weight
    for rank, m in enumerate(shards("target", world=4)):
        attn = m.model.layers[1].self_attn
        first_q_head = rank * attn.n_heads
        kv = first_q_head // group
        assert (attn.n_heads, attn.n_kv) == (2, 1)
        torch.testing.assert_close(attn.k_proj.weight, k_full[kv * hd:(kv + 1) * hd], rtol=0, atol=0)
