"""Notebook 06's models: `inferlab train --models moe,...` on a toy shape, and the shipped ones."""
import json
import os

import pytest
import torch

from inferlab import train

from inferlab.model import moe
from inferlab.model.loader import ASSETS, load_checkpoint

from .conftest import run_json

os.environ.setdefault("TQDM_DISABLE", "1")
ARGS = ["--preset", "tiny", "--max-files", "6", "--vocab-size", "400", "--no-compile", "--quiet",
        "--log-every", "1000", "--eval-tokens", "2000"]


def test_moe_and_gqa_training_smoke(tmp_path):
    import transformers

    run, out = tmp_path / "run", tmp_path / "models"
    base = ARGS + ["--run-dir", str(run), "--out", str(out)]
    assert train.main(base + ["--models", "moe,mha", "--steps", "30"]) == 0
    rows = [json.loads(line) for line in (run / "moe" / "loss.jsonl").read_text().splitlines()]
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.3 and all(r["max_expert_load"] >= 1.0 for r in rows)
    m = json.loads((out / "moe" / "metrics.json").read_text())
    assert m["total_params"] > m["active_params"] and len(m["routing"]["load_per_layer"][0]) == 8
    model, _ = load_checkpoint(out / "moe", device="cpu")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out / "moe", dtype=torch.float32).eval()
    ids = torch.randint(0, 400, (1, 20))
    with torch.no_grad():
        assert (hf(ids).logits - model(ids)).abs().max().item() <= 1e-4  # a Mixtral transformers loads
    assert train.main(base + ["--models", "gqa"]) == 0  # 5% of mha's 30 steps, from the pooled model
    g = json.loads((out / "gqa" / "metrics.json").read_text())
    mha = json.loads((out / "mha" / "metrics.json").read_text())
    assert g["training"]["steps"] == 2 and 2 * g["kv_bytes_per_token"] == mha["kv_bytes_per_token"]
    assert "ppl_mean_pooled_before_uptraining" in g


@pytest.fixture
def arch_assets():
    if not all((ASSETS / n / "model.safetensors").exists() for n in ("moe", "mha", "gqa", "mqa")):
        pytest.skip("notebook 06's models are not built: see `inferlab train --help`")


def test_shipped_moe_is_small_and_sparse(arch_assets):
    m = json.loads((ASSETS / "moe" / "metrics.json").read_text())
    assert (ASSETS / "moe" / "model.safetensors").stat().st_size <= 10 * 2**20
    cfg = load_checkpoint("moe", device="cpu")[0].config
    assert cfg.num_local_experts == 8 and m["active_params"] == moe.active_parameters(cfg) < m["total_params"] / 1.8


def test_bench_gqa_json(arch_assets, capsys):
    data = run_json(capsys, "bench", "gqa", "--json", "--eval-tokens", "600", "--batch", "2", "--context", "16",
                    "--new-tokens", "2", "--repeats", "1")
    by = {v["name"]: v for v in data["variants"]}
    assert set(by) == {"mha", "gqa_mean_pooled", "gqa_uptrained", "mqa_mean_pooled", "mqa_uptrained"}
    assert [by[n]["num_kv_heads"] for n in ("mha", "gqa_uptrained", "mqa_uptrained")] == [4, 2, 1]
    assert by["mha"]["kv_bytes_per_token"] == 4 * by["mqa_uptrained"]["kv_bytes_per_token"]
    assert by["mqa_uptrained"]["max_seqs_in_kv_budget"] == 4 * by["mha"]["max_seqs_in_kv_budget"]
    assert all(v["decode_tokens_per_s"] > 0 and v["ppl"] > 1 for v in data["variants"])
    assert data["ppl_protocol"] == {"split": "test", "tokens": 600, "window": 512, "stride": 256, "whole_split": False}
