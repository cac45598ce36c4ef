"""Distil a draft for a chat target from the target itself: ``inferlab train draft --target smollm2``.

The draft (``inferlab.spec.layer_draft``) starts as a few of the target's layers over its shared
embedding, with the head restricted to a draft vocabulary. Training makes it imitate the whole
target, as DistillSpec does (Zhou et al., ICLR 2024): at every position of the target's own greedy
answers (and of the prompts they answer) the loss is the forward KL divergence KL(p || q) between
the target's next-token distribution p and the draft's q, both over the draft vocabulary. Greedy
speculation keeps a guess when it equals the target's argmax, so the figure that matters is the
held-out *agreement*: how often the draft's argmax is the target's greedy token.

The data is what ``inferlab train eagle`` left in its run folder: the target's answers to
prompts built offline (answers.jsonl) and the target's last-layer features at every position
(features.safetensors), from which p is one small product (final norm, then the head's rows of the
draft vocabulary). Nothing here runs the 30-layer target again, so a step costs the draft's own
forward and backward. Checkpoints every 50 steps; a rerun resumes.
"""
from __future__ import annotations

import argparse
import json
import logging
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from inferlab.errors import InferlabError
from inferlab.spec import layer_draft
from inferlab.spec.eagle_train import draft_vocabulary, feature_stage, length_buckets, read_answers, resume, set_lr
from inferlab.spec.medusa import beside_target

log = logging.getLogger("inferlab.draft_train")


def draft_hidden(draft, ids: torch.Tensor) -> torch.Tensor:
    """[B, T] ids -> the draft's final-norm hidden states [B, T, H] (the head left out)."""
    head, draft.lm_head = draft.lm_head, nn.Identity()
    try:
        return draft(ids)
    finally:
        draft.lm_head = head


def batch(samples, feats, idx, target, rows):
    """Right-padded ids [B, T], the target's log-probabilities over the draft vocabulary at every
    position [B, T, n] (the next token's), and the mask of real positions with a next token."""
    seqs = [samples[i]["prompt_ids"] + samples[i]["answer_ids"] for i in idx]
    t = max(map(len, seqs))
    ids = torch.zeros(len(idx), t, dtype=torch.long)
    mask = torch.zeros(len(idx), t, dtype=torch.bool)
    f = torch.zeros(len(idx), t, target.config.hidden_size)
    for b, (i, s) in enumerate(zip(idx, seqs)):
        ids[b, :len(s)] = torch.tensor(s)
        mask[b, :len(s) - 1] = True
        f[b, :len(s)] = feats[i][:len(s)].float()
    with torch.no_grad():
        p_log = F.log_softmax(F.linear(target.model.norm(f), rows), -1)
    return ids, p_log, mask


def agreement(draft, samples, feats, target, rows, batch_size: int = 8) -> dict:
    """On answer positions: how often the draft's argmax equals the target's greedy token (the
    answers are the target's greedy outputs; a token off the draft vocabulary is a miss), and the
    mean KL(p || q) over the draft vocabulary."""
    hits = kl = count = 0
    vocab = draft.lm_head.guess_vocab
    with torch.no_grad():
        for lo in range(0, len(samples), batch_size):
            idx = list(range(lo, min(lo + batch_size, len(samples))))
            ids, p_log, _ = batch(samples, feats, idx, target, rows)
            q_log = F.log_softmax(draft.lm_head.sub_logits(draft_hidden(draft, ids)), -1)
            for b, i in enumerate(idx):
                n_p, n_a = len(samples[i]["prompt_ids"]), len(samples[i]["answer_ids"])
                pos = slice(n_p - 1, n_p + n_a - 1)  # positions whose next token is an answer token
                truth = ids[b, n_p:n_p + n_a]
                hits += int((vocab[q_log[b, pos].argmax(-1)] == truth).sum())
                kl += float(F.kl_div(q_log[b, pos], p_log[b, pos], log_target=True, reduction="sum"))
                count += n_a
    return {"tokens": count, "greedy_agreement": round(hits / max(count, 1), 4), "kl": round(kl / max(count, 1), 4)}


def train(draft, target, samples, feats, rows, steps: int, lr: float, batch_size: int, run_dir: Path, seed: int,
          quiet: bool = False) -> float:
    """AdamW on the draft's layers and norm (the shared embedding stays frozen), warmup then cosine
    decay; resumes from draft_ckpt.pt. Returns the seconds it trained."""
    ckpt = run_dir / "draft_ckpt.pt"
    params = [p for n, p in draft.named_parameters() if not n.startswith("model.embed_tokens")]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    start, spent = resume(ckpt, draft, opt, strict=False)  # the checkpoint leaves the shared embedding out
    buckets = length_buckets(samples, batch_size)
    draft.train()
    t0, ema = time.monotonic(), None
    bar = tqdm(range(start, steps), desc="draft", unit="step", disable=quiet, initial=start, total=steps)
    for step in bar:
        idx = random.Random(seed * 100003 + step).choice(buckets)
        set_lr(opt, lr, step, steps)
        ids, p_log, mask = batch(samples, feats, idx, target, rows)
        q_log = F.log_softmax(draft.lm_head.sub_logits(draft_hidden(draft, ids)), -1)
        loss = F.kl_div(q_log[mask], p_log[mask], log_target=True, reduction="batchmean")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        bar.set_postfix(kl=f"{ema:.3f}", refresh=False)
        if (step + 1) % 50 == 0 or step + 1 == steps:
            seconds = spent + time.monotonic() - t0
            state = {k: v for k, v in draft.state_dict().items() if not k.startswith(("model.embed", "lm_head"))}
            torch.save({"draft": state, "opt": opt.state_dict(), "step": step + 1, "seconds": seconds}, ckpt)
            log.info("step %d/%d  kl %.4f  %.0fs", step + 1, steps, ema, seconds)
    draft.eval()
    return spent + time.monotonic() - t0


def model_card(s: dict) -> str:
    b, a = s["held_out"]["before"], s["held_out"]["after"]
    return f"""# {s['base_model']}_draft

A draft model for speculative decoding with `{s['base_model']}` as the target, cut from the target
itself (`inferlab.spec.layer_draft`): {len(s['source_layers'])} decoder layers that start as the
target's layers {s['source_layers']}, over the target's own token embedding (shared, not stored),
with the target's tied head restricted to a {s['draft_vocab_size']:,}-token draft vocabulary (the
tokens the target's answers use most; q is 0 elsewhere, so rejection sampling stays exact).
Stored: {s['parameters']:,} parameters in fp16, {s['stored_mb']:.1f} MB.

Trained by `{s['command']}`: forward KL(p_target || q_draft) over the draft vocabulary
(DistillSpec, Zhou et al. ICLR 2024) at every position of {s['train_answers']} of the target's greedy
answers and the prompts they answer ({s['train_positions']:,} positions), {s['steps']} steps of
{s['batch_size']} sequences, learning rate {s['lr']}, {s['train_time_s']:.0f} s on {s['threads']} CPU threads.

| held out: {s['held_out_answers']} answers to prompts not trained on, {a['tokens']:,} answer tokens | before training | after |
|---|---|---|
| greedy agreement with the target (acceptance of greedy speculation, per guess) | {b['greedy_agreement']:.1%} | {a['greedy_agreement']:.1%} |
| KL(p_target \\|\\| q_draft), nats per token | {b['kl']:.3f} | {a['kl']:.3f} |

Cost: one draft token costs c = {s['draft_cost_ratio']:.3f} of a target token (fp32, batch 1,
the engine's paged path, this machine). `inferlab bench spec --target {s['base_model']} --methods draft`
measures the acceptance and speed-up through the engine.
"""


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="inferlab train draft", description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2", help="the frozen target (default: smollm2)")
    p.add_argument("--answers", default="runs/eagle",
                   help="the run folder of `inferlab train eagle` (answers + features; default: runs/eagle)")
    p.add_argument("--layers", default="0,1,29",
                   help="the target's layers the draft starts from, comma-separated (default: 0,1,29)")
    p.add_argument("--draft-vocab", type=int, default=4096, help="draft vocabulary size (default: 4096)")
    p.add_argument("--steps", type=int, default=600, help="optimizer steps (default: 600)")
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (default: 3e-4)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step (default: 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-dir", default="runs/draft", help="checkpoints and log (default: runs/draft)")
    p.add_argument("--out", default=None, help="where the draft goes (default: inferlab/assets/models/<target>_draft)")
    p.add_argument("--no-ship", action="store_true", help="measure only; do not write the draft")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    try:
        layers = [int(x) for x in args.layers.split(",")]
    except ValueError:
        raise InferlabError(f"--layers takes layer numbers separated by commas, e.g. 0,1,29; got {args.layers!r}")
    if min(args.draft_vocab, args.steps, args.batch_size) < 1:
        raise InferlabError("--draft-vocab, --steps and --batch-size must be >= 1")
    from inferlab.bench.spec import costs
    from inferlab.llm import load_model

    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        handlers=[logging.StreamHandler(), logging.FileHandler(run_dir / "draft.log")])
    torch.manual_seed(args.seed)
    target, _, _ = load_model(args.target, "cpu", quantization="none")
    target.eval().requires_grad_(False)
    n = target.config.num_hidden_layers
    if not layers or any(not 0 <= i < n for i in layers):
        raise InferlabError(f"--layers must name layers of the target, 0..{n - 1}; got {args.layers!r}")
    samples = read_answers(Path(args.answers))
    feats = feature_stage(target, Path(args.answers), samples, args.quiet)
    held = max(1, len(samples) // 20)  # the last 5%, less any prompt also trained on
    seen = {s["prompt"] for s in samples[:-held]}
    train_i = list(range(len(samples) - held))
    test_i = [i for i in range(len(samples) - held, len(samples)) if samples[i]["prompt"] not in seen]
    vocab = draft_vocabulary([samples[i] for i in train_i], args.draft_vocab, tuple(target.config.eos_token_ids))
    draft = layer_draft.build(target, layers, vocab)
    rows = draft.lm_head.rows
    test_s, test_f = [samples[i] for i in test_i], [feats[i] for i in test_i]
    before = agreement(draft, test_s, test_f, target, rows)
    log.info("held out before training: %s", before)
    train_s = [samples[i] for i in train_i]
    seconds = train(draft, target, train_s, [feats[i] for i in train_i], rows, args.steps, args.lr,
                    args.batch_size, run_dir, args.seed, args.quiet)
    after = agreement(draft, test_s, test_f, target, rows)
    log.info("held out after training: %s", after)
    params = sum(v.numel() for k, v in layer_draft.trained_tensors(draft).items() if k != "guess_vocab")
    summary = {"method": "layer draft: the target's layers over its shared embedding, draft-vocabulary head, "
                         "forward KL to the target (DistillSpec)",
               "base_model": args.target, "source_layers": layers, "draft_vocab_size": len(vocab),
               "parameters": params, "stored_mb": round(params * 2 / 1e6, 2), "train_answers": len(train_s),
               "held_out_answers": len(test_s),
               "train_positions": sum(len(s["prompt_ids"]) + len(s["answer_ids"]) - 1 for s in train_s),
               "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed,
               "train_time_s": round(seconds, 1), "held_out": {"before": before, "after": after},
               "draft_cost_ratio": round(costs(target, 128, (), 20, draft=draft)["draft"], 4), "threads": torch.get_num_threads(),
               "command": " ".join(["inferlab train draft", *argv])}
    print(json.dumps(summary))
    if not args.no_ship:
        out = Path(args.out) if args.out else beside_target(args.target, "draft")
        layer_draft.save(draft, out, args.target, layers, {"README.md": model_card(summary),
                                                           "metrics.json": json.dumps(summary, indent=1) + "\n"})
        log.info("saved to %s", out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(__import__("sys").argv[1:]))
