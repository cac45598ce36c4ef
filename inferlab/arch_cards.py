"""Model cards of notebook 06's models (MoE, MHA and its GQA/MQA conversions)."""
from __future__ import annotations

from inferlab.model.config import ModelConfig

_WHAT = {
    "moe": "a Mixtral-style mixture of experts: the draft's attention and size per token, with the dense MLP "
           "replaced by {e} SwiGLU experts of width {f}, {k} chosen per token by a learnt router, trained "
           "with the Switch Transformer load-balancing loss (coefficient {coef})",
    "moe_noaux": "the MoE model trained without the load-balancing loss (an ablation)",
    "mha": "the draft's shape with multi-head attention: one key/value head per query head",
    "gqa": "the MHA model converted to grouped-query attention ({kv} K/V heads) by mean-pooling each group's "
           "key and value heads (Ainslie et al. 2023), then uptrained",
    "mqa": "the MHA model converted to multi-query attention (1 K/V head) by mean-pooling all key and value "
           "heads (Ainslie et al. 2023), then uptrained",
}


def card(name: str, cfg: ModelConfig, m: dict) -> str:
    t = m.get("training", {})
    what = _WHAT[name].format(e=cfg.num_local_experts, f=cfg.intermediate_size, k=cfg.num_experts_per_tok,
                              coef=cfg.router_aux_loss_coef, kv=cfg.num_key_value_heads)
    rows = [("layers", cfg.num_hidden_layers), ("hidden size", cfg.hidden_size),
            ("attention", f"{cfg.num_attention_heads} query heads, {cfg.num_key_value_heads} key/value heads, "
                          f"head dim {cfg.head_dim}"),
            ("MLP", f"{cfg.num_local_experts} experts x SwiGLU {cfg.intermediate_size}, top-{cfg.num_experts_per_tok}"
             if cfg.num_local_experts else f"SwiGLU {cfg.intermediate_size}"),
            ("parameters (total / active per token)", f"{m['total_params']:,} / {m['active_params']:,}"),
            ("FLOPs per token (batch 1)", f"{m['flops_per_token']:,}"),
            ("KV cache per token (fp16)", f"{m['kv_bytes_per_token']:,} bytes"),
            ("test-split perplexity", f"{m['test_ppl']:.2f} over {m['test_tokens']:,} tokens")]
    if "ppl_mean_pooled_before_uptraining" in m:
        rows.append(("perplexity right after mean-pooling (no uptraining)", f"{m['ppl_mean_pooled_before_uptraining']:.2f}"))
    if "routing" in m:
        rows.append(("busiest expert's share x E on test text (1.0 = even)", m["routing"]["max_expert_load"]))
    if "without_aux_loss" in m:
        w = m["without_aux_loss"]
        rows.append(("same, trained without the load-balancing loss", f"{w['routing']['max_expert_load']} "
                     f"(perplexity {w['test_ppl']:.2f} after {w['training'].get('steps')} steps)"))
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    steps = t.get("steps")
    how = (f"`inferlab train --models {name}` (from `mha`, {steps} steps: 5% of its training)"
           if name in ("gqa", "mqa") else f"`inferlab train --models {name} --steps {steps}`")
    return f"""# inferlab/{name}

{what[0].upper() + what[1:]}. Trained by inferlab on the Python standard library with the embedded
pair's tokenizer, for notebook 06 (architecture for inference); same corpus, split, recipe and
seed as the draft (AdamW, peak learning rate {t.get('lr')}, batches of {t.get('batch_size')} x
{t.get('seq_len')} tokens, {steps} steps, {t.get('tokens_seen', 0):,} tokens, {t.get('train_time_s', 0) / 60:.1f} min
on 2 shared CPU cores).

| | |
|---|---|
{table}

Perplexity: sliding window 512, stride 256, float32 from the float16 weights
(`inferlab eval ppl --model {name} --json`). Reproduce with {how}.
"""
