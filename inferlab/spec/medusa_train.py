"""``inferlab train medusa``: Medusa-1 heads on the frozen target (Cai et al. 2024, section 2.2.1).

The target never changes: each step runs it once without gradients over windows of the corpus's
train split, keeps its final hidden states h_t, and trains only the heads: head i (1-based) learns
to predict x_{t+1+i} from h_t with cross-entropy, through the target's own lm_head. The losses
are summed with Medusa's weights 0.8^(i-1) (a far head is harder and noisier; it should not drown
the near ones). Before saving, every head's top-1 accuracy is measured on the held-out test split
(code no step has seen); the card records it with the steps and data. The heads ship beside the
target (``target_medusa``) and are small: one hidden x hidden block each.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from inferlab.errors import InferlabError
from inferlab.model.loader import ASSETS, load_checkpoint, resolve_model_path
from inferlab.spec.medusa import MedusaHeads, capture_hidden, heads_folder_for, save_heads
from inferlab.train import get_batch, prepare_data

log = logging.getLogger("inferlab.medusa")
HEAD_DECAY = 0.8  # Medusa's lambda_i = 0.8^i


def _set_lr(opt, lr: float, step: int, steps: int, warmup: int) -> None:
    """Linear warmup, then cosine decay to 10% of ``lr``."""
    for g in opt.param_groups:
        g["lr"] = lr * (step + 1) / warmup if step < warmup else \
            lr * (0.1 + 0.45 * (1 + np.cos(np.pi * (step - warmup) / max(1, steps - warmup))))


def hidden_states(target, x: torch.Tensor) -> torch.Tensor:
    """[B, T] token ids -> the target's final-norm hidden states [B, T, H] (no gradients)."""
    with torch.no_grad(), capture_hidden(target) as seen:
        target(x)
    return seen[-1]


def head_labels(target, tokens: torch.Tensor, n: int):
    """For ``tokens`` [B, T + 1 + n]: the hidden states h_0..h_{T-1} and two label sets, per head i
    (1-based) at each t: x_{t+1+i} itself ("corpus", Medusa-1), and the target's own greedy choice
    there, argmax p(x_{t+1+i} | x_{<=t+i}) ("target": self-distillation, Medusa section 2.3.2; a
    guess is accepted when it equals the target's choice, not the corpus's)."""
    t = tokens.shape[1] - 1 - n
    with torch.no_grad(), capture_hidden(target) as seen:
        logits = target(tokens[:, :t + n])
    best = logits.argmax(-1)  # best[:, s] is the target's guess for x_{s+1}
    return (seen[-1][:, :t], {"corpus": [tokens[:, 1 + i:1 + i + t] for i in range(1, n + 1)],
                              "target": [best[:, i:i + t] for i in range(1, n + 1)]})


def head_losses(heads: MedusaHeads, target, tokens: torch.Tensor, labels: str = "corpus") -> torch.Tensor:
    """Cross-entropy of each head over ``tokens`` [B, T + 1 + n] (``head_labels``). Returns [n]."""
    h, ys = head_labels(target, tokens, heads.num_heads)
    logits = heads(h, target.lm_head)  # [n, B, T, V]
    return torch.stack([F.cross_entropy(logits[i].flatten(0, 1), y.flatten()) for i, y in enumerate(ys[labels])])


@torch.no_grad()
def head_accuracy(heads: MedusaHeads, target, stream: np.ndarray, seq_len: int, max_tokens: int | None) -> dict:
    """Top-1 accuracy of the target's own next token (head 0) and of each head on ``stream``,
    over consecutive windows; every position whose label exists counts once."""
    n = heads.num_heads
    hits, agree, count = np.zeros(n + 1), np.zeros(n), 0
    limit = len(stream) if max_tokens is None else min(len(stream), max_tokens)
    for s in range(0, limit - seq_len - n - 1, seq_len):
        tokens = torch.from_numpy(stream[s:s + seq_len + 1 + n].astype(np.int64))[None]
        h, ys = head_labels(target, tokens, n)
        corpus, chosen = ys["corpus"], ys["target"]
        guesses = heads(h, target.lm_head).argmax(-1)  # [n, 1, T]
        hits[0] += int((target.lm_head(h).argmax(-1) == tokens[:, 1:1 + seq_len]).sum())
        for i in range(n):
            hits[i + 1] += int((guesses[i] == corpus[i]).sum())
            agree[i] += int((guesses[i] == chosen[i]).sum())
        count += seq_len
    return {"tokens": count, "next_token_top1": round(float(hits[0] / count), 4),
            "head_top1": [round(float(hits[i] / count), 4) for i in range(1, n + 1)],
            "head_target_agreement": [round(float(agree[i] / count), 4) for i in range(n)]}


def train(target_name: str, num_heads: int, steps: int, lr: float, batch_size: int, seq_len: int, seed: int,
          run_dir: Path, eval_tokens: int | None, quiet: bool, labels: str = "target"):
    torch.manual_seed(seed)
    target, tok = load_checkpoint(target_name, device="cpu", dtype=torch.float32)
    target.eval().requires_grad_(False)
    folder = resolve_model_path(target_name)
    _, streams, info = prepare_data(run_dir, tok.vocab_size, None, shared_tokenizer=folder / "tokenizer.json")
    heads = MedusaHeads(target.config.hidden_size, num_heads)
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    weights = torch.tensor([HEAD_DECAY ** i for i in range(num_heads)])
    warmup = max(1, steps // 20)
    t0, ema = time.monotonic(), None
    bar = tqdm(range(steps), desc="medusa heads", unit="step", disable=quiet)
    for step in bar:
        _set_lr(opt, lr, step, steps, warmup)
        x, y = get_batch(streams["train"], step, seed + 7, batch_size, seq_len + num_heads)
        losses = head_losses(heads, target, torch.cat([x, y[:, -1:]], 1), labels)
        (weights * losses).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        cur = losses.detach().numpy()
        ema = cur if ema is None else 0.95 * ema + 0.05 * cur
        bar.set_postfix(loss=" ".join(f"{v:.2f}" for v in ema), refresh=False)
        if (step + 1) % 50 == 0 or step + 1 == steps:
            log.info("step %d/%d  head losses %s  %.0fs", step + 1, steps, " ".join(f"{v:.3f}" for v in ema),
                     time.monotonic() - t0)
    acc = head_accuracy(heads, target, streams["test"], seq_len, eval_tokens)
    log.info("held-out top-1: %s", acc)
    summary = {"method": "Medusa-1: residual heads on the frozen target's final hidden state, target lm_head",
               "labels": labels,
               "base_model": str(target_name), "num_heads": num_heads, "steps": steps, "batch_size": batch_size,
               "seq_len": seq_len, "lr": lr, "seed": seed, "loss_weights": [round(float(w), 3) for w in weights],
               "tokens_seen": steps * batch_size * seq_len, "train_time_s": round(time.monotonic() - t0, 1),
               "final_loss_ema": [round(float(v), 4) for v in ema], "corpus": info, "held_out": acc}
    return heads, summary


# ---------------------------------------------------------------- a chat target's own answers

def answer_positions(target, sample: dict, feature: torch.Tensor, n: int):
    """The final-norm hidden states h_t of one prompt + answer of ``inferlab train eagle``'s run
    (``feature``: its last layer's output at every position) at each t whose next token starts or
    continues the answer and whose x_{t+1+n} exists, and per head i the token x_{t+1+i}: the
    target's own greedy choice there (the answers are its greedy outputs: self-distillation)."""
    ids = torch.tensor(sample["prompt_ids"] + sample["answer_ids"])
    lo, hi = len(sample["prompt_ids"]) - 1, len(ids) - 1 - n
    if hi <= lo:
        return None
    with torch.no_grad():
        h = target.model.norm(feature[lo:hi].float())
    return h, [ids[lo + 1 + i:hi + 1 + i] for i in range(1, n + 1)]


def train_on_answers(target_name: str, num_heads: int, steps: int, lr: float, batch_size: int, seed: int,
                     run_dir: Path, vocab: int, quiet: bool):
    """Heads for a chat target (smollm2) from the answers and features ``inferlab train eagle``
    left in ``run_dir``; the last 5% of answers are held out (those whose prompt is not also
    among the training answers). The cross-entropy runs over the
    ``vocab`` tokens the training answers use most (the target's head rows of those tokens: a
    49,152-row head per position and head would cost 12x more for the last few percent of
    tokens), and the heads then guess among those tokens only (``guess_vocab``), as the held-out
    agreement is measured."""
    from inferlab.llm import load_model
    from inferlab.spec.eagle_train import draft_vocabulary, feature_stage, read_answers

    torch.manual_seed(seed)
    target, tok, _ = load_model(target_name, "cpu", quantization="none")
    target.eval().requires_grad_(False)
    samples = read_answers(run_dir)
    feats = feature_stage(target, run_dir, samples, quiet)
    held = max(1, len(samples) // 20)
    data = [answer_positions(target, s, f, num_heads) for s, f in zip(samples, feats)]
    seen = {s["prompt"] for s in samples[:-held]}  # a held-out answer to a prompt also trained on would flatter
    train_d = [d for d in data[:-held] if d]
    test_d = [d for s, d in zip(samples[-held:], data[-held:]) if d and s["prompt"] not in seen]
    keep = draft_vocabulary(samples[:-held], vocab, tuple(target.config.eos_token_ids))
    t2d = torch.full((target.config.vocab_size,), -100, dtype=torch.long)
    t2d[keep] = torch.arange(len(keep))
    rows = target.lm_head.weight[keep].detach()  # [vocab, H]
    heads = MedusaHeads(target.config.hidden_size, num_heads)
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    weights = torch.tensor([HEAD_DECAY ** i for i in range(num_heads)])
    warmup, rng, t0, ema = max(1, steps // 20), np.random.default_rng(seed), time.monotonic(), None
    for step in tqdm(range(steps), desc="medusa heads", unit="step", disable=quiet):
        _set_lr(opt, lr, step, steps, warmup)
        picked = [train_d[i] for i in rng.choice(len(train_d), batch_size, replace=False)]
        h = torch.cat([d[0] for d in picked])
        losses = torch.stack([F.cross_entropy(block(h) @ rows.T, t2d[torch.cat([d[1][i] for d in picked])],
                                              ignore_index=-100) for i, block in enumerate(heads.blocks)])
        (weights * losses).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        cur = losses.detach().numpy()
        ema = cur if ema is None else 0.95 * ema + 0.05 * cur
        if (step + 1) % 50 == 0 or step + 1 == steps:
            log.info("step %d/%d  head losses %s  %.0fs", step + 1, steps, " ".join(f"{v:.3f}" for v in ema),
                     time.monotonic() - t0)
    train_s = time.monotonic() - t0
    heads.guess_vocab = keep  # guesses come from the trained vocabulary (MedusaHeads.propose)
    hits, count = np.zeros(num_heads), 0
    for h, ys in test_d:  # as the engine guesses
        guesses = heads.propose(h, target.lm_head, num_heads)  # [T, n]
        hits += np.array([int((guesses[:, i] == ys[i]).sum()) for i in range(num_heads)])
        count += len(h)
    acc = {"tokens": count, "head_target_agreement": [round(float(v / count), 4) for v in hits]}
    log.info("held-out agreement with the target: %s", acc)
    summary = {"method": "Medusa-1: residual heads on the frozen target's final hidden state, target lm_head",
               "labels": "target", "data": "answers", "base_model": str(target_name), "num_heads": num_heads,
               "steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed, "train_vocab": len(keep),
               "loss_weights": [round(float(w), 3) for w in weights],
               "train_answers": len(train_d), "held_out_answers": len(test_d),
               "train_positions": sum(len(d[0]) for d in train_d), "train_time_s": round(train_s, 1),
               "final_loss_ema": [round(float(v), 4) for v in ema], "held_out": acc}
    return heads, summary


def model_card(s: dict) -> str:
    a = s["held_out"]
    rows = "\n".join(f"| head {i + 1} | x(t+{i + 2}) | {v:.1%} | {w:.1%} |"
                     for i, (v, w) in enumerate(zip(a["head_top1"], a["head_target_agreement"])))
    what = ("the target's own greedy choice at t+1+i given the true prefix (self-distillation, Medusa section "
            "2.3.2: a guess is kept when it equals the target's choice)" if s["labels"] == "target"
            else "the corpus token x(t+1+i) (Medusa-1's plain recipe)")
    return f"""# inferlab/{s['base_model']}_medusa

{s['num_heads']} Medusa heads (Cai et al. 2024, Medusa-1) for the embedded `{s['base_model']}`: each is one
residual block h + SiLU(W h + b) on the target's final hidden state, followed by the target's own
frozen lm_head (so only {s['num_heads']} x (hidden^2 + hidden) weights ship). Trained by
`inferlab train medusa` on the frozen target: {s['steps']} steps of {s['batch_size']} windows x {s['seq_len']}
tokens ({s['tokens_seen']:,} tokens of the corpus's train split, {s['corpus']['source']}), AdamW at
{s['lr']}, loss weights 0.8^(i-1), seed {s['seed']}, {s['train_time_s']:.0f} s on CPU. Head i learned {what}.

Top-1 accuracy on the held-out test split ({a['tokens']:,} positions, code no step saw), against the
corpus token and against the target's own greedy choice there:

| predictor | predicts | top-1 (corpus) | top-1 (target's choice) |
|---|---|---|---|
| target lm_head | x(t+1) | {a['next_token_top1']:.1%} | 100% |
{rows}

Use: `LLM("target", speculative_config={{"method": "medusa", "num_speculative_tokens": {s['num_heads']}}})`.
The heads guess by argmax and the engine verifies with the deterministic-draft rule, so outputs
follow the target exactly; the guesses' acceptance is what `inferlab bench spec` measures.
"""


def answers_card(s: dict) -> str:
    a = s["held_out"]
    rows = "\n".join(f"| head {i + 1} | x(t+{i + 2}) | {v:.1%} |" for i, v in enumerate(a["head_target_agreement"]))
    return f"""# inferlab/{s['base_model']}_medusa

{s['num_heads']} Medusa heads (Cai et al. 2024, Medusa-1) for `{s['base_model']}`: each is one residual block
h + SiLU(W h + b) on the target's final hidden state, followed by the target's own frozen lm_head
(only {s['num_heads']} x (hidden^2 + hidden) weights ship). Trained by `{s.get('command', 'inferlab train medusa')}`
on {s['train_answers']} of the target's own greedy answers to chat prompts ({s['train_positions']:,} answer
positions; the answers and features of `inferlab train eagle`'s run): head i learns the token the
target chose at t+1+i (self-distillation). {s['steps']} steps of {s['batch_size']} answers, AdamW at {s['lr']},
loss weights 0.8^(i-1), cross-entropy over the {s['train_vocab']} tokens the answers use most, seed
{s['seed']}, {s['train_time_s']:.0f} s on CPU.

Agreement with the target's own choice on {s['held_out_answers']} held-out answers ({a['tokens']:,} positions),
guessing among those {s['train_vocab']} tokens (`guess_vocab`, as the engine does: a head's logits over the
whole 49,152-token vocabulary would read the 113 MB head once per guess):

| predictor | predicts | top-1 agreement |
|---|---|---|
{rows}

Use: `LLM("{s['base_model']}", speculative_config={{"method": "medusa", "num_speculative_tokens": {s['num_heads']}}})`.
The heads guess by argmax and the engine verifies with the deterministic-draft rule, so outputs
follow the target exactly; `inferlab bench spec --target {s['base_model']}` measures their acceptance.
"""


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="inferlab train medusa", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="target", help="the frozen target (default: target)")
    p.add_argument("--num-heads", type=int, default=4, help="heads, i.e. the largest k (default: 4)")
    p.add_argument("--steps", type=int, default=400, help="optimizer steps (default: 400)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default: 2e-3)")
    p.add_argument("--batch-size", type=int, default=8, help="windows per step (default: 8)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per window (default: 256)")
    p.add_argument("--labels", choices=["target", "corpus"], default="target",
                   help="what head i learns at t: the target's own greedy choice for x(t+1+i) (self-distillation) "
                        "or the corpus token (default: target)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-tokens", type=int, default=None, help="cap the held-out tokens scored (default: all)")
    p.add_argument("--run-dir", default="runs/stdlib", help="token cache and train.log (default: runs/stdlib)")
    p.add_argument("--out", default=None, help="where the heads go (default: <target folder>_medusa)")
    p.add_argument("--answers", default=None, metavar="RUN_DIR",
                   help="train on a chat target's own answers instead of the corpus: the answers and features "
                        "`inferlab train eagle` wrote to RUN_DIR (e.g. runs/eagle, for --model smollm2)")
    p.add_argument("--train-vocab", type=int, default=4096,
                   help="with --answers: the tokens the cross-entropy runs over (default: 4096)")
    p.add_argument("--no-ship", action="store_true", help="measure only; do not write the heads")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.steps < 1 or args.num_heads < 1 or args.batch_size < 1 or args.seq_len < 2:
        raise InferlabError("--steps, --num-heads and --batch-size must be >= 1, --seq-len >= 2")
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        handlers=[logging.StreamHandler(), logging.FileHandler(run_dir / "medusa.log")])
    if args.answers:
        heads, summary = train_on_answers(args.model, args.num_heads, args.steps, args.lr, args.batch_size,
                                          args.seed, Path(args.answers), args.train_vocab, args.quiet)
        summary["command"] = " ".join(["inferlab train medusa", *argv])
    else:
        heads, summary = train(args.model, args.num_heads, args.steps, args.lr, args.batch_size, args.seq_len,
                               args.seed, run_dir, args.eval_tokens, args.quiet, args.labels)
    print(json.dumps(summary["held_out"]))
    if not args.no_ship:
        out = Path(args.out) if args.out else heads_folder_for(args.model)
        card = answers_card(summary) if args.answers else model_card(summary)
        save_heads(heads, out, args.model, {"README.md": card,
                                             "metrics.json": json.dumps(summary, indent=1) + "\n"})
        log.info("saved to %s", out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(__import__("sys").argv[1:]))
