"""Distil the draft from the target (DistillSpec, Zhou et al. ICLR 2024): ``inferlab distill``.

Speculative decoding pays in proportion to how often the draft guesses what the target would
emit, so the draft should imitate the *target*, not the corpus. Trained from scratch on the
corpus, the shipped draft agreed with the target's greedy choice at 47% of held-out positions.
Here it keeps training on the same train split, but against the target's full next-token
distribution instead of the one-hot next token: the loss at every position is the forward
KL divergence KL(p_target || q_draft) (token-level knowledge distillation, Hinton et al. 2015).
DistillSpec compares divergences and data sources; forward KL on fixed data is the simplest of
its variants, needs no generation during training, and already moves greedy agreement (the
acceptance rate of greedy speculation). The draft starts from its shipped weights; the target
is frozen. Before and after, greedy agreement and perplexity are measured on the held-out test
split, and the new model's card and ``metrics.json`` record both. The result ships as
``draft_distilled``; the plain ``draft`` is left as it was.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from inferlab.model.loader import ASSETS, load_checkpoint, save_checkpoint
from inferlab.train import RECIPES, get_batch, lr_at, make_optimizer, prepare_data

log = logging.getLogger("inferlab.distill")


def distill_loss(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(p || q), p = softmax(target), q = softmax(draft)."""
    q_log = F.log_softmax(draft_logits.float().flatten(0, -2), -1)
    p_log = F.log_softmax(target_logits.float().flatten(0, -2), -1)
    return F.kl_div(q_log, p_log, log_target=True, reduction="batchmean")


def measure(draft, target, ids, max_tokens: int) -> dict:
    from inferlab.eval.ppl import evaluate

    r = evaluate(draft, ids, reference=target, max_tokens=max_tokens)
    return {"test_ppl": round(r["ppl"], 3), "test_nll_per_token": round(r["nll_per_token"], 4),
            "draft_target_agreement": round(r["agreement"], 4), "tokens": r["tokens"]}


def distill(steps: int, lr: float = 1e-3, batch_size: int = 8, seq_len: int = 256, seed: int = 0,
            run_dir: Path = Path("runs/stdlib"), eval_tokens: int | None = None,
            quiet: bool = False) -> dict:
    from inferlab.eval.ppl import test_stream

    target, tok = load_checkpoint(ASSETS / "target", device="cpu", dtype=torch.float32)
    draft, _ = load_checkpoint(ASSETS / "draft", device="cpu", dtype=torch.float32)
    target.eval().requires_grad_(False)
    _, streams, _ = prepare_data(run_dir, tok.vocab_size, None, shared_tokenizer=ASSETS / "target" / "tokenizer.json")
    held_out = test_stream(tok)
    before = measure(draft, target, held_out, eval_tokens)
    log.info("before: %s", before)
    recipe = RECIPES["draft"]
    recipe = type(recipe)(**{**recipe.__dict__, "lr": lr, "warmup_steps": 20})
    opt = make_optimizer(draft, recipe)
    draft.train()
    t0, ema = time.monotonic(), None
    bar = tqdm(range(steps), desc="distil draft", unit="step", disable=quiet)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, recipe)
        x, _ = get_batch(streams["train"], step, seed + 1, batch_size, seq_len)
        with torch.no_grad():
            teacher = target(x)
        loss = distill_loss(draft(x), teacher)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), recipe.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        bar.set_postfix(kl=f"{ema:.3f}", refresh=False)
    draft.eval()
    after = measure(draft, target, held_out, eval_tokens)
    log.info("after: %s", after)
    summary = {"method": "token-level forward KL(p_target || q_draft) on train-split windows (DistillSpec)",
               "steps": steps, "batch_size": batch_size, "seq_len": seq_len, "lr": lr, "seed": seed,
               "tokens_seen": steps * batch_size * seq_len, "time_s": round(time.monotonic() - t0, 1),
               "final_kl_ema": round(ema, 4) if ema is not None else None,
               "before": before, "after": after, "eval_tokens": eval_tokens}
    return draft, tok, summary


def model_card(metrics: dict) -> str:
    """The distilled draft's README: what it is, how it was made, what was measured."""
    d = metrics["distillation"]
    b, a = d["before"], d["after"]
    return f"""# inferlab/draft_distilled

The embedded `draft` (0.92M parameters, same architecture and tokenizer), trained further to imitate
the embedded `target`: `inferlab distill` ({d['steps']} steps of {d['batch_size']} windows x {d['seq_len']}
tokens, {d['tokens_seen']:,} tokens of the train split, learning rate {d['lr']}, seed {d['seed']}).
The loss at every position is KL(p_target || q_draft), the target's whole next-token distribution
instead of the corpus's one-hot next token (token-level distillation, as in DistillSpec, Zhou et al.
ICLR 2024). It exists for speculative decoding: the more often the draft guesses what the target
would emit, the more guesses the verifier keeps.

| measured on the test split ({a['tokens']:,} tokens, window 512, stride 256) | `draft` | `draft_distilled` |
|---|---|---|
| greedy agreement with `target` (acceptance rate of greedy speculation) | {b['draft_target_agreement']:.1%} | {a['draft_target_agreement']:.1%} |
| perplexity | {b['test_ppl']:.2f} | {a['test_ppl']:.2f} |

The plain `draft` stays as it was: notebook 06 compares it with models trained on the corpus alone.
"""


def ship(draft, tok, summary: dict, out: Path, source: Path = ASSETS / "draft") -> None:
    """Write the distilled draft as its own model folder beside the shipped draft, with a card."""
    out, source = Path(out), Path(source)
    base = json.loads((source / "metrics.json").read_text())
    after = summary["after"]
    metrics = {"name": out.name, "params": draft.num_parameters(), "distilled_from": source.name,
               "teacher": "target", "corpus": base.get("corpus"), "distillation": summary}
    if summary.get("eval_tokens") is None:  # the whole test split: the cards' own protocol
        metrics.update(test_ppl=after["test_ppl"], test_nll_per_token=after.get("test_nll_per_token"),
                       test_tokens=after["tokens"], draft_target_agreement=after["draft_target_agreement"])
    extra = {"metrics.json": json.dumps(metrics, indent=1) + "\n", "README.md": model_card(metrics)}
    for name in ("tokenizer_config.json", "generation_config.json"):
        if (source / name).exists():
            extra[name] = (source / name).read_text()
    dtype = getattr(torch, json.loads((source / "config.json").read_text()).get("torch_dtype", "float32"))
    save_checkpoint(draft, tok, out, dtype=dtype, extra_files=extra)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="inferlab distill", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400, help="optimizer steps (default: 400)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default: 1e-3)")
    p.add_argument("--batch-size", type=int, default=8, help="windows per step (default: 8)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per window (default: 256)")
    p.add_argument("--eval-tokens", type=int, default=None,
                   help="cap the held-out tokens scored before and after (default: the whole test split)")
    p.add_argument("--run-dir", default="runs/stdlib", help="token cache (default: runs/stdlib)")
    p.add_argument("--out", default=str(ASSETS / "draft_distilled"),
                   help="where the distilled draft is written (default: the package's draft_distilled)")
    p.add_argument("--no-ship", action="store_true", help="measure only; do not write the model")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be >= 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    draft, tok, summary = distill(args.steps, args.lr, args.batch_size, args.seq_len, run_dir=Path(args.run_dir),
                                  eval_tokens=args.eval_tokens, quiet=args.quiet)
    print(json.dumps(summary, indent=1))
    if not args.no_ship:
        ship(draft, tok, summary, Path(args.out))
    return 0
