"""Training pieces for notebook 06's models (``inferlab train --models moe,moe_noaux,mha,gqa,mqa``).

- ``moe``: a Mixtral-style model of the draft's size: 8 SwiGLU experts of width 192 per layer,
  2 chosen per token, so a token uses the draft's MLP width (384); trained with the load-balancing
  loss. ``moe_noaux`` is the same without it (an ablation, kept in the run folder, not shipped).
- ``mha``: the draft's shape with one K/V head per query head; ``gqa`` and ``mqa`` start from it,
  K/V heads mean-pooled (``inferlab.model.gqa``), and are uptrained for 5% of its steps.

Each shipped model gets ``metrics.json`` and a model card, like the embedded pair.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

from inferlab.model import moe
from inferlab.errors import InferlabError
from inferlab.model.gqa import kv_bytes_per_token, mean_pool_kv_heads

log = logging.getLogger("inferlab.train")
ARCH_MODELS = ("moe", "moe_noaux", "mha", "gqa", "mqa")
SHIPPED = ("moe", "mha", "gqa", "mqa")


def model_folder(name: str, out_dir: Path, run_dir: Path) -> Path:
    """Shipped models go to the package assets; the ablation stays in the run folder."""
    return out_dir / name if name in SHIPPED else run_dir / name / "model"


def converted_start(recipe, out_dir: Path, run_dir: Path):
    """The starting point of GQA/MQA uptraining: the shipped MHA model, K/V heads mean-pooled."""
    from inferlab.model.loader import load_checkpoint

    src = out_dir / recipe.convert_from
    if not (src / "config.json").exists():
        raise InferlabError(f"{recipe.convert_from!r} is not trained yet: run `inferlab train --models "
                            f"{recipe.convert_from} --steps 900` first")
    model, _ = load_checkpoint(src, device="cpu", dtype=torch.float32)
    steps = json.loads((src / "metrics.json").read_text())["training"]["steps"] if (src / "metrics.json").exists() \
        else json.loads((run_dir / recipe.convert_from / "summary.json").read_text())["steps"]
    log.info("starting from %s with K/V heads mean-pooled %d -> %d; uptraining %.0f%% of its %d steps",
             src, model.config.num_key_value_heads, recipe.num_key_value_heads, 100 * recipe.uptrain_fraction, steps)
    return mean_pool_kv_heads(model, recipe.num_key_value_heads), steps


def moe_step_stats(model) -> dict:
    """The load-balancing loss of this step (a tensor, for the gradient) and how balanced the
    routing was: ``max_expert_load`` = the busiest expert's share times E (1.0 = perfectly even)."""
    blocks = moe.moe_blocks(model)
    logits = [b.router_logits for b in blocks]
    e, k = blocks[0].num_experts, blocks[0].top_k
    aux = moe.load_balancing_loss(logits, e, k)
    with torch.no_grad():
        worst = max(moe.expert_load(lg, e, k).max().item() * e for lg in logits)
    return {"aux_loss": aux, "router_aux": aux.item(), "max_expert_load": worst}


@torch.no_grad()
def routing_stats(model, ids: np.ndarray, tokens: int = 8192, seq_len: int = 512) -> dict:
    """Expert load per layer on held-out text, and the load-balancing loss there."""
    n = min(tokens, len(ids)) // seq_len * seq_len
    x = torch.as_tensor(ids[:n].astype(np.int64)).view(-1, seq_len)
    model(x)
    blocks = moe.moe_blocks(model)
    e, k = blocks[0].num_experts, blocks[0].top_k
    loads = [moe.expert_load(b.router_logits, e, k).tolist() for b in blocks]
    return {"tokens": n, "load_per_layer": [[round(v, 4) for v in row] for row in loads],
            "max_expert_load": round(max(max(row) for row in loads) * e, 3),
            "aux_loss": round(moe.load_balancing_loss([b.router_logits for b in blocks], e, k).item(), 4)}


def load_curve(loss_log: Path, every: int = 10) -> list[list[float]]:
    """[step, busiest expert's share x E] every ``every`` steps, from the training log."""
    if not loss_log.exists():
        return []
    rows = [json.loads(line) for line in loss_log.read_text().splitlines() if line.strip()]
    last = {r["step"]: r["max_expert_load"] for r in rows if "max_expert_load" in r}  # a resumed run repeats steps
    return [[step, round(v, 3)] for step, v in sorted(last.items()) if step % every == 0]


def per_token_costs(cfg) -> dict:
    """Parameters, FLOPs and weight bytes (fp16) of one decode token at batch 1, embeddings aside
    for FLOPs (a lookup) but not for the lm_head (a matmul)."""
    total = cfg.num_params_hint
    active = moe.active_parameters(cfg)
    matmul_params = active - cfg.vocab_size * cfg.hidden_size * (0 if cfg.tie_word_embeddings else 1)
    return {"total_params": total, "active_params": active, "flops_per_token": 2 * matmul_params,
            "weight_bytes_per_token_batch1": 2 * matmul_params, "weight_bytes_total": 2 * total,
            "kv_bytes_per_token": kv_bytes_per_token(cfg)}


def finish(out_dir: Path, run_dir: Path, names: list[str], corpus_info: dict, args) -> None:
    """Measure and describe each trained model of notebook 06 (metrics.json + card)."""
    from inferlab.arch_cards import card
    from inferlab.eval.ppl import evaluate, test_stream
    from inferlab.model.loader import load_checkpoint

    names = [n for n in names if n in ARCH_MODELS and (model_folder(n, out_dir, run_dir) / "config.json").exists()]
    ids = None
    for n in names:
        folder = model_folder(n, out_dir, run_dir)
        model, tok = load_checkpoint(folder, device="cpu", dtype=torch.float32)
        ids = test_stream(tok, max_files=args.max_files) if ids is None else ids
        res = evaluate(model, ids, max_tokens=args.eval_tokens)
        summary_path = run_dir / n / "summary.json"
        metrics = {"name": n, "params": model.num_parameters(), "test_ppl": round(res["ppl"], 3),
                   "test_nll_per_token": round(res["nll_per_token"], 4), "test_tokens": res["tokens"],
                   **per_token_costs(model.config), "corpus": corpus_info,
                   "training": json.loads(summary_path.read_text()) if summary_path.exists() else {}}
        if model.config.num_local_experts:
            metrics["routing"] = routing_stats(model, ids)
            metrics["load_during_training"] = load_curve(run_dir / n / "loss.jsonl")
            other = model_folder("moe_noaux" if n == "moe" else "moe", out_dir, run_dir)
            if n == "moe" and (other / "metrics.json").exists():
                metrics["without_aux_loss"] = {k: json.loads((other / "metrics.json").read_text())[k]
                                               for k in ("test_ppl", "routing", "training", "load_during_training")}
        src = out_dir / "mha"
        if n in ("gqa", "mqa") and (src / "config.json").exists():
            pooled = mean_pool_kv_heads(load_checkpoint(src, device="cpu", dtype=torch.float32)[0],
                                        model.config.num_key_value_heads)
            metrics["ppl_mean_pooled_before_uptraining"] = round(evaluate(pooled, ids, max_tokens=args.eval_tokens)["ppl"], 3)
        log.info("%s: test ppl %.3f over %d tokens", n, res["ppl"], res["tokens"])
        (folder / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
        (folder / "README.md").write_text(card(n, model.config, metrics))
