"""``inferlab train``: train the embedded model pair on the Python standard library.

One command, reproducible from a seed, runs the whole recipe:

1. read the corpus (``inferlab.corpus``: the stdlib's non-test ``.py`` files, split by file);
2. train a byte-level BPE tokenizer (HF ``tokenizers``) on the train split, shared by both models;
3. encode every split once and cache the token ids under the run folder;
4. train the draft, then the target: AdamW, linear warmup then cosine decay, gradient clipping,
   batches of random windows cut from the train split (files joined by ``<|endoftext|>``);
5. save each model in HF format (fp16 safetensors) into ``inferlab/assets/models/{draft,target}``,
   measure held-out perplexity and draft/target agreement, and write each model card.

Checkpoints (weights + optimizer state, safetensors) are written to ``runs/stdlib/<model>/`` every
few minutes; rerunning the same command resumes where it stopped.

``--budget MINUTES`` fits the run into a wall-clock budget: after a few calibration steps the
total number of steps is fixed from the measured speed and written to the log, so
``--steps N`` replays that schedule exactly. ``--steps`` alone gives quick smoke runs.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from inferlab import arch_train, corpus
from inferlab.model.config import ModelConfig
from inferlab.device import compile_errors
from inferlab.errors import InferlabError
from inferlab.model.loader import ASSETS, save_checkpoint
from inferlab.model import CausalLM
from inferlab.model.tokenizer import EOT, Tokenizer, train_bpe
log = logging.getLogger("inferlab.train")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Shape and optimisation settings of one model."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    lr: float
    batch_size: int  # sequences per step
    seq_len: int = 512
    budget_share: float = 0.5  # fraction of --budget this model gets
    warmup_steps: int = 60
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # mixture of experts (inferlab.model.moe): num_local_experts > 0 makes a Mixtral-style model
    num_local_experts: int = 0
    num_experts_per_tok: int = 2
    router_aux_loss_coef: float = 0.0
    # GQA/MQA uptraining (inferlab.model.gqa): start from this shipped model, K/V heads mean-pooled,
    # and train for this fraction of its steps (Ainslie et al. 2023 use 5%)
    convert_from: str | None = None
    uptrain_fraction: float = 0.05


RECIPES = {
    # ~0.9M parameters, half of them in the (tied) embedding: fast enough to draft for the target.
    "draft": Recipe(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, lr=3e-3, batch_size=8, budget_share=0.16),
    # ~5.6M parameters, GQA with 8 query heads sharing 2 key/value heads.
    "target": Recipe(hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=8,
                     num_key_value_heads=2, lr=2e-3, batch_size=8, budget_share=0.84),
    # a toy shape for smoke tests: trains in seconds, proves the loss goes down.
    "tiny": Recipe(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=1, lr=1e-2, batch_size=4, seq_len=64, warmup_steps=5),
}
# Models of notebook 06 (architecture), all the draft's size, so they compare at equal cost:
_DRAFT = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, lr=3e-3, batch_size=8)
RECIPES.update({
    # Mixtral-style: 8 experts of width 192, 2 per token -> the draft's active MLP width (384)
    "moe": Recipe(**_DRAFT, intermediate_size=192, num_key_value_heads=2, num_local_experts=8,
                  num_experts_per_tok=2, router_aux_loss_coef=0.01),
    "moe_noaux": Recipe(**_DRAFT, intermediate_size=192, num_key_value_heads=2, num_local_experts=8,
                        num_experts_per_tok=2, router_aux_loss_coef=0.0),
    # the draft with one K/V head per query head, then converted to GQA (2) and MQA (1) and uptrained
    "mha": Recipe(**_DRAFT, intermediate_size=384, num_key_value_heads=4),
    "gqa": Recipe(**_DRAFT, intermediate_size=384, num_key_value_heads=2, convert_from="mha", warmup_steps=5),
    "mqa": Recipe(**_DRAFT, intermediate_size=384, num_key_value_heads=1, convert_from="mha", warmup_steps=5),
})
TRAIN_ORDER = ("draft", "target")  # the draft is quick, so something usable ships early


def model_config(recipe: Recipe, tokenizer: Tokenizer) -> ModelConfig:
    eot = tokenizer.hf.token_to_id(EOT)
    return ModelConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads,
        head_dim=recipe.hidden_size // recipe.num_attention_heads,
        max_position_embeddings=max(recipe.seq_len, 512),
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=eot,
        eos_token_ids=(eot,),
        architecture="MixtralForCausalLM" if recipe.num_local_experts else "LlamaForCausalLM",
        num_local_experts=recipe.num_local_experts,
        num_experts_per_tok=recipe.num_experts_per_tok,
        router_aux_loss_coef=recipe.router_aux_loss_coef,
    )


# ---------------------------------------------------------------- tokenizer and token cache

def train_tokenizer(files: list[corpus.SourceFile], vocab_size: int) -> Tokenizer:
    """Byte-level BPE (GPT-2 style): every byte is a token, merges learnt from the train split."""
    return train_bpe((f.text for f in files if f.split == "train"), vocab_size)


def prepare_data(run_dir: Path, vocab_size: int, max_files: int | None, shared_tokenizer: Path | None = None):
    """Tokenizer and token streams per split, cached in ``run_dir`` (keyed by the corpus hash).
    Models trained beside the shipped pair reuse its tokenizer (``shared_tokenizer``) when it exists."""
    files = corpus.load_corpus(max_files=max_files)
    if not files:
        raise InferlabError(f"no source files found under {corpus.stdlib_root()}: is the standard library installed?")
    key = f"{corpus.fingerprint(files)}-v{vocab_size}"
    data_dir = run_dir / "data" / key
    tok_path = data_dir / "tokenizer.json"
    if not tok_path.exists() and shared_tokenizer is not None and shared_tokenizer.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        tok_path.write_bytes(shared_tokenizer.read_bytes())
        log.info("using the shipped tokenizer %s", shared_tokenizer)
    if tok_path.exists():
        tok = Tokenizer.from_file(tok_path)
        eot = tok.hf.token_to_id(EOT)
        tok = Tokenizer(tok.hf, (eot,), eot)
    else:
        log.info("training a %d-entry BPE tokenizer on %d train files", vocab_size,
                 sum(f.split == "train" for f in files))
        tok = train_tokenizer(files, vocab_size)
        data_dir.mkdir(parents=True, exist_ok=True)
        tok.save(tok_path)
    streams = {}
    for split in corpus.SPLITS:
        path = data_dir / f"{split}.npy"
        if not path.exists():
            np.save(path, corpus.token_stream(tok, [f for f in files if f.split == split]).astype(np.uint16))
        streams[split] = np.load(path)
    info = {"fingerprint": corpus.fingerprint(files), "files": {s: sum(f.split == s for f in files) for s in corpus.SPLITS},
            "tokens": {s: int(len(v)) for s, v in streams.items()}, "source": corpus.describe()}
    log.info("corpus %s: files %s, tokens %s", info["fingerprint"], info["files"], info["tokens"])
    return tok, streams, info


# ---------------------------------------------------------------- the training loop

def init_weights(model: CausalLM, seed: int) -> None:
    """GPT-2 style init: N(0, 0.02) everywhere, residual output projections scaled by 1/sqrt(2L)."""
    g = torch.Generator().manual_seed(seed)
    n_layers = model.config.num_hidden_layers
    for name, p in model.named_parameters():
        if p.dim() < 2:
            continue  # RMSNorm weights stay at 1
        std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("o_proj.weight", "down_proj.weight", "w2.weight")) else 0.02
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=g) * std)


def lr_at(step: int, total: int, recipe: Recipe) -> float:
    """Linear warmup, then cosine decay from ``lr`` to ``min_lr_ratio * lr`` at ``total``."""
    warmup = min(recipe.warmup_steps, max(1, total // 5))
    if step < warmup:
        return recipe.lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return recipe.lr * (recipe.min_lr_ratio + (1 - recipe.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def get_batch(stream: np.ndarray, step: int, seed: int, batch_size: int, seq_len: int):
    """Random windows of ``seq_len + 1`` tokens; the draw depends only on (seed, step), so resuming
    replays the same batches."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(stream) - seq_len - 1, size=batch_size)
    chunk = torch.from_numpy(np.stack([stream[s:s + seq_len + 1] for s in starts]).astype(np.int64))
    return chunk[:, :-1], chunk[:, 1:]


@torch.no_grad()
def mean_loss(model: CausalLM, stream: np.ndarray, seq_len: int, max_windows: int = 16) -> float:
    """Mean next-token loss over up to ``max_windows`` evenly spaced windows (a quick validation)."""
    model.eval()
    n = min(max_windows, max(1, (len(stream) - 1) // seq_len))
    seq_len = min(seq_len, len(stream) - 1)
    starts = np.linspace(0, len(stream) - seq_len - 1, n).astype(np.int64)
    chunk = torch.from_numpy(np.stack([stream[s:s + seq_len + 1] for s in starts]).astype(np.int64))
    logits = model(chunk[:, :-1])
    model.train()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1)).item()


def make_optimizer(model: CausalLM, recipe: Recipe) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=recipe.lr, betas=(0.9, 0.95), eps=1e-8)


def save_resume(folder: Path, model: CausalLM, opt: torch.optim.Optimizer, state: dict) -> None:
    """Weights and AdamW moments as safetensors, counters as JSON, written atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in model.checkpoint_state_dict().items()}
    opt_state = opt.state_dict()
    for idx, s in opt_state["state"].items():
        for k, v in s.items():
            tensors[f"opt.{idx}.{k}"] = torch.as_tensor(v).detach().contiguous()
    save_file(tensors, str(folder / "resume.safetensors.tmp"))
    os.replace(folder / "resume.safetensors.tmp", folder / "resume.safetensors")
    (folder / "resume.json.tmp").write_text(json.dumps(state, indent=1))
    os.replace(folder / "resume.json.tmp", folder / "resume.json")


def load_resume(folder: Path, model: CausalLM, opt: torch.optim.Optimizer) -> dict:
    tensors = load_file(str(folder / "resume.safetensors"))
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")}, strict=False)
    model.tie_weights()
    opt_state = opt.state_dict()
    opt_state["state"] = {}
    for k, v in tensors.items():
        if k.startswith("opt."):
            _, idx, name = k.split(".", 2)
            opt_state["state"].setdefault(int(idx), {})[name] = v
    opt.load_state_dict(opt_state)
    return json.loads((folder / "resume.json").read_text())


def train_one(name: str, recipe: Recipe, cfg: ModelConfig, streams: dict, args, run_dir: Path) -> tuple[CausalLM, dict]:
    """Train one model; returns the model and a summary of the run (steps, tokens, time, losses)."""
    torch.manual_seed(args.seed)
    model = CausalLM(cfg)
    init_weights(model, args.seed)
    if recipe.convert_from:  # GQA/MQA uptraining starts from the mean-pooled MHA model
        model, source_steps = arch_train.converted_start(recipe, Path(args.out), run_dir)
        args = argparse.Namespace(**{**vars(args), "steps": max(1, round(recipe.uptrain_fraction * source_steps))})
    model.train()
    # torch.compile fuses the many small elementwise ops (RMSNorm, RoPE, SwiGLU) that dominate
    # a small model on CPU: measured ~2x faster per step here after a ~1 minute compile. An MoE's
    # data-dependent dispatch (tokens per expert) breaks the graph, so it trains eagerly.
    forward = torch.compile(model) if args.compile and not cfg.num_local_experts else model
    opt = make_optimizer(model, recipe)
    folder = run_dir / name
    state = {"step": 0, "total_steps": args.steps, "elapsed_s": 0.0, "seed": args.seed,
             "config": cfg.to_hf_dict(), "recipe": dataclasses.asdict(recipe)}
    if (folder / "resume.json").exists() and not args.fresh:
        saved = json.loads((folder / "resume.json").read_text())
        if saved.get("config") == state["config"] and saved.get("seed") == args.seed and saved.get("recipe") == state["recipe"]:
            state = load_resume(folder, model, opt)
            if args.steps is not None and args.steps != state["total_steps"]:
                state["total_steps"] = args.steps  # an explicit --steps re-targets the schedule
            log.info("%s: resuming at step %d of %s", name, state["step"], state["total_steps"])
        else:
            log.info("%s: checkpoint in %s has another config or seed; starting afresh", name, folder)
    train = streams["train"]
    if len(train) <= recipe.seq_len + 1:
        raise InferlabError(f"the train split has only {len(train)} tokens: use more files (--max-files)")
    budget_s = args.budget * 60 * recipe.budget_share if args.budget else None
    if state["total_steps"] is None and budget_s is None:
        raise InferlabError("give --steps N or --budget MINUTES")
    tokens_per_step = recipe.batch_size * recipe.seq_len
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "loss.jsonl", "a") as loss_log:
        calib_from, calib_steps = None, 30
        last_save = time.monotonic()
        t_start = time.monotonic() - state["elapsed_s"]
        t_process, first_step = time.monotonic(), state["step"]
        bar = tqdm(total=state["total_steps"], initial=state["step"], desc=f"train {name}", unit="step",
                   dynamic_ncols=True, disable=args.quiet, mininterval=0.5 if sys.stderr.isatty() else 30)
        step = state["step"]
        ema = None
        while state["total_steps"] is None or step < state["total_steps"]:
            total = state["total_steps"] or 10**9
            lr = lr_at(step, total if state["total_steps"] else recipe.warmup_steps * 100, recipe)
            for group in opt.param_groups:
                group["lr"] = lr
            x, y = get_batch(train, step, args.seed, recipe.batch_size, recipe.seq_len)
            try:
                logits = forward(x)
            except compile_errors() as exc:  # e.g. no C++ compiler for torch.compile: train eagerly instead
                if forward is model:
                    raise
                log.info("%s: torch.compile failed (%s); training without it", name, type(exc).__name__)
                forward = model
                logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            extra = arch_train.moe_step_stats(model) if cfg.num_local_experts else {}
            if cfg.router_aux_loss_coef:  # Switch Transformer's load-balancing loss (inferlab.model.moe)
                loss = loss + cfg.router_aux_loss_coef * extra.pop("aux_loss")
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip).item()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            now = time.monotonic()
            ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
            loss_log.write(json.dumps({"step": step, "loss": round(loss.item(), 5), "lr": lr,
                                       "grad_norm": round(grad_norm, 4), "elapsed_s": round(now - t_start, 2),
                                       **{k: round(float(v), 5) for k, v in extra.items() if k != "aux_loss"}}) + "\n")
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.3f}", lr=f"{lr:.2e}", refresh=False)
            if state["total_steps"] is None:  # calibrate the step count to the wall-clock budget
                if step == 3:  # steps 1-2 include compilation
                    calib_from = (step, now)
                elif calib_from and step == calib_from[0] + calib_steps:
                    sec_per_step = (now - calib_from[1]) / calib_steps
                    state["total_steps"] = step + max(1, int((budget_s - (now - t_start)) / sec_per_step))
                    bar.total = state["total_steps"]
                    log.info("%s: %.2f s/step (%.0f tok/s); budget %.1f min -> total_steps=%d",
                             name, sec_per_step, tokens_per_step / sec_per_step, budget_s / 60, state["total_steps"])
            elif (calib_from and args.steps is None and step % 25 == 0 and step < state["total_steps"] // 2):
                # on a shared machine the speed drifts: re-fit the step count during the first half,
                # while the cosine schedule is still near its peak and a longer tail costs nothing
                sec_per_step = (now - calib_from[1]) / (step - calib_from[0])
                refit = step + max(1, int((budget_s - (now - t_start)) / sec_per_step))
                if abs(refit - state["total_steps"]) > 0.02 * state["total_steps"]:
                    state["total_steps"] = bar.total = refit
                    log.info("%s: %.2f s/step on average -> total_steps=%d", name, sec_per_step, refit)
            if step % args.log_every == 0 or step == state["total_steps"]:
                val = mean_loss(model, streams["validation"], recipe.seq_len, 8) if len(streams["validation"]) > 2 else float("nan")
                speed = (step - first_step) * tokens_per_step / max(1e-9, now - t_process)
                log.info("%s step %d/%s loss %.4f (ema %.4f) val %.4f lr %.2e %.0f tok/s", name, step,
                         state["total_steps"], loss.item(), ema, val, lr, speed)
            if now - last_save > args.save_every * 60 and state["total_steps"] and step < state["total_steps"]:
                save_resume(folder, model, opt, {**state, "step": step, "elapsed_s": now - t_start})
                last_save = now
        bar.close()
    elapsed = time.monotonic() - t_start
    state.update(step=step, elapsed_s=elapsed)
    save_resume(folder, model, opt, state)
    model.eval()
    summary = {"steps": step, "tokens_seen": step * tokens_per_step, "train_time_s": round(elapsed, 1),
               "batch_size": recipe.batch_size, "seq_len": recipe.seq_len, "lr": recipe.lr,
               "final_train_loss_ema": round(ema, 4) if ema is not None else None,
               "validation_loss": round(mean_loss(model, streams["validation"], recipe.seq_len, 32), 4)
               if len(streams["validation"]) > 2 else None, "seed": args.seed}
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    log.info("%s: done, %d steps (replay with --steps %d), %.1f min, validation loss %s", name, step, step,
             elapsed / 60, summary["validation_loss"])
    return model, summary


# ---------------------------------------------------------------- shipping: evaluation and model cards

def finish(out_dir: Path, run_dir: Path, names: list[str], corpus_info: dict, args) -> None:
    """Measure each shipped model (held-out perplexity, greedy agreement), write metrics and cards."""
    from inferlab.eval.ppl import evaluate, test_stream
    from inferlab.model.loader import load_checkpoint

    shipped = [n for n in TRAIN_ORDER if (out_dir / n / "config.json").exists()]
    models, results = {}, {}
    for n in shipped:
        model, tok = load_checkpoint(out_dir / n, device="cpu", dtype=torch.float32)
        models[n] = (model, tok)
    if not models:
        return
    tok = next(iter(models.values()))[1]
    ids = None
    for n, (model, _) in models.items():
        saved = out_dir / n / "metrics.json"
        if args.cards_only and not args.remeasure and saved.exists():  # rewrite the card text only
            m = json.loads(saved.read_text())
            results[n] = {"ppl": m["test_ppl"], "nll_per_token": m["test_nll_per_token"], "tokens": m["test_tokens"]}
            if n == "draft" and m.get("draft_target_agreement") is not None:
                results[n]["agreement"] = m["draft_target_agreement"]
            continue
        ref = models["target"][0] if n == "draft" and "target" in models else None
        ids = test_stream(tok, max_files=args.max_files) if ids is None else ids
        results[n] = evaluate(model, ids, reference=ref, max_tokens=args.eval_tokens)
        log.info("%s: test ppl %.3f over %d tokens%s", n, results[n]["ppl"], results[n]["tokens"],
                 f", greedy agreement with target {results[n]['agreement']:.4f}" if ref is not None else "")
    agreement = results.get("draft", {}).get("agreement")
    for n, (model, tok) in models.items():
        summary_path = run_dir / n / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        metrics = {"name": n, "params": model.num_parameters(), "test_ppl": round(results[n]["ppl"], 3),
                   "test_nll_per_token": round(results[n]["nll_per_token"], 4), "test_tokens": results[n]["tokens"],
                   "draft_target_agreement": None if agreement is None else round(agreement, 4),
                   "corpus": corpus_info, "training": summary}
        sample = greedy_sample(out_dir / n)
        (out_dir / n / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
        (out_dir / n / "README.md").write_text(model_card(n, model.config, metrics, sample))


def greedy_sample(folder: Path, prompt: str = "def fibonacci(n):", max_tokens: int = 64) -> str:
    from inferlab import LLM, SamplingParams
    llm = LLM(model=str(folder), device="cpu")
    return prompt + llm.generate([prompt], SamplingParams(temperature=0, max_tokens=max_tokens))[0].outputs[0].text


def model_card(name: str, cfg: ModelConfig, m: dict, sample: str) -> str:
    t, c = m["training"], m["corpus"]
    other = "draft" if name == "target" else "target"
    agree = (f"{m['draft_target_agreement']:.1%} of test-split positions: the draft's greedy next token equals "
             f"the target's, on the test split's own text. At temperature 0 this estimates the chance that "
             f"speculative decoding accepts each draft token."
             if m["draft_target_agreement"] is not None else "not measured (the other model is missing).")
    minutes = f"{t['train_time_s'] / 60:.1f} min" if t.get("train_time_s") else "unknown"
    rows = "\n".join(f"| {s} | {c['files'][s]} | {c['tokens'][s]:,} |" for s in corpus.SPLITS)
    return f"""# inferlab/{name}

A {m['params'] / 1e6:.2f}M-parameter Llama-architecture code-completion model, trained from scratch by
`inferlab train` on the Python standard library. It is the {name} of inferlab's embedded model pair:
the {other} shares its tokenizer, so the two can be used together for speculative decoding.
Small enough to train on two CPU cores in about an hour; it completes Python idioms, but
as a model of a few million parameters it also repeats itself.

## Architecture

| | |
|---|---|
| layers | {cfg.num_hidden_layers} |
| hidden size | {cfg.hidden_size} (SwiGLU MLP {cfg.intermediate_size}) |
| attention | {cfg.num_attention_heads} query heads, {cfg.num_key_value_heads} key/value heads (GQA), head dim {cfg.head_dim}, RoPE theta {cfg.rope_theta:g} |
| context | {cfg.max_position_embeddings} tokens |
| vocabulary | {cfg.vocab_size} (byte-level BPE, `<|endoftext|>` = {cfg.eos_token_ids[0]}) |
| embeddings | tied (input embedding = output projection) |
| parameters | {m['params']:,} |
| weights | `model.safetensors`, float16 (inferlab computes in float32 on CPU) |

## Corpus and split

{c["source"]}: every non-test `.py` file (folders `test`, `tests`, `idle_test` and files `test_*.py`
left out), read at training time, never copied. Files are assigned to a split by a hash of their
relative path (`sha256 mod 100`: 0-89 train, 90-94 validation, 95-99 test), so the split is the same
on every machine.

| split | files | tokens |
|---|---|---|
{rows}

Corpus fingerprint `{c['fingerprint']}` (a hash of the files' paths and contents).
Each file is preceded by `<|endoftext|>` and the files are joined into one stream per split.

## Training recipe

AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), peak learning rate {t.get('lr')}, linear
warmup then cosine decay to 10% of the peak, gradient clipping at 1.0, batches of
{t.get('batch_size')} random windows of {t.get('seq_len')} tokens from the train split, float32 on CPU,
GPT-2 style initialisation, seed {t.get('seed')}. {t.get('steps')} steps, {t.get('tokens_seen', 0):,} tokens
seen, {minutes} of wall-clock time on 2 CPU cores shared with other jobs.

## Results

| metric | value |
|---|---|
| test-split perplexity | {m['test_ppl']:.2f} ({m['test_nll_per_token']:.4f} nats/token over {m['test_tokens']:,} tokens) |
| validation loss (end of training) | {t.get('validation_loss')} |
| draft/target greedy agreement | {agree} |

Perplexity uses a sliding window of 512 tokens with a stride of 256 (each token is scored once,
with at least 256 tokens of context once the window has filled), computed from these float16
weights in float32. Reproduce it with `inferlab eval ppl --model {name} --json`; the numbers
are exact for the Python version above and close for other versions (the corpus is their stdlib).

Greedy completion (`inferlab generate "def fibonacci(n):" --model {name}`):

```python
{sample}
```

## Retraining

```bash
inferlab train --budget 60 --threads 1           # both models, resumable; draft first
inferlab train --models {name} --steps {t.get('steps')}   # a run of exactly this model's length, same seed
inferlab eval ppl --model {name} --json          # the perplexity above
```

`--budget` fits the number of steps to the measured speed (re-fitted during the first half of
the run), so its length depends on the machine; `--steps` fixes it. With other jobs sharing the
cores, `--threads 1` avoids threads waiting on each other and is several times faster.
Checkpoints, the token cache and `train.log` go to `runs/stdlib/`; rerunning the same command
after an interruption resumes from the last checkpoint. `inferlab train --help` lists every option.
"""


# ---------------------------------------------------------------- command line

def build_parser() -> argparse.ArgumentParser:
    from inferlab.cli import HelpFormatter

    p = argparse.ArgumentParser(formatter_class=HelpFormatter, prog="inferlab train", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="draft,target",
                   help="comma-separated, trained in this order (default: draft,target); notebook 06 trains "
                        "moe, moe_noaux (ablation), mha, then gqa and mqa (uptrained from mha, 5%% of its steps)")
    p.add_argument("--budget", type=float, default=None, help="total wall-clock minutes for all models (split by recipe share)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per model (overrides --budget)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights, data order and sampling")
    p.add_argument("--preset", choices=["default", "tiny"], default="default",
                   help="tiny: a toy shape for every model, for smoke tests")
    p.add_argument("--vocab-size", type=int, default=4096, help="BPE tokenizer entries")
    p.add_argument("--max-files", type=int, default=None, help="use only the first N files of each split (smoke runs)")
    p.add_argument("--run-dir", default="runs/stdlib", help="checkpoints, logs and token cache (default: runs/stdlib)")
    p.add_argument("--out", default=str(ASSETS), help="where the HF model folders are written (default: the package assets)")
    p.add_argument("--fresh", action="store_true", help="ignore existing checkpoints and start over")
    p.add_argument("--save-every", type=float, default=3.0, help="minutes between resumable checkpoints")
    p.add_argument("--log-every", type=int, default=50, help="steps between log lines with a validation loss")
    p.add_argument("--eval-tokens", type=int, default=None, help="cap the test tokens scored for the model cards")
    p.add_argument("--no-ship", action="store_true", help="train only; do not write the model folders")
    p.add_argument("--cards-only", action="store_true",
                   help="rewrite the shipped models' cards (reusing metrics.json unless --remeasure)")
    p.add_argument("--remeasure", action="store_true", help="with --cards-only: measure perplexity and agreement again")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: torch's choice); 1 is faster when other jobs share the cores")
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="train eagerly (torch.compile costs ~1 minute up front, then runs ~2x faster on CPU)")
    return p


def setup_logging(run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    log.setLevel(logging.INFO)
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()
    fmt = logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S")
    for h in (logging.FileHandler(run_dir / "train.log"), logging.StreamHandler(sys.stderr)):
        h.setFormatter(fmt)
        log.addHandler(h)
    log.propagate = False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    known = [n for n in RECIPES if n != "tiny"]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise InferlabError(f"unknown model(s) {', '.join(bad) or '(none)'}: choose from {', '.join(known)}")
    if args.steps is not None and args.steps < 1:
        raise InferlabError("--steps must be >= 1")
    if args.budget is not None and args.budget <= 0:
        raise InferlabError("--budget must be a positive number of minutes")
    if args.steps is None and args.budget is None and not args.cards_only and \
            not all(RECIPES[n].convert_from for n in names):  # uptraining takes its length from the source
        raise InferlabError("give --budget MINUTES (a full run: --budget 60) or --steps N (a smoke run)")
    if args.threads:
        torch.set_num_threads(args.threads)
    run_dir, out_dir = Path(args.run_dir), Path(args.out)
    setup_logging(run_dir)
    log.info("inferlab train %s", " ".join(argv))
    pair = set(names) & set(TRAIN_ORDER)
    tok, streams, info = prepare_data(run_dir, args.vocab_size, args.max_files,
                                      shared_tokenizer=None if pair else Path(args.out) / "target" / "tokenizer.json")
    if not args.cards_only:
        for name in names:
            recipe = RECIPES[name]
            if args.preset == "tiny":  # the toy shape, keeping the architecture (experts, K/V heads, source)
                r = RECIPES["tiny"]
                recipe = dataclasses.replace(recipe, **{f.name: getattr(r, f.name) for f in dataclasses.fields(r)
                                                        if f.name not in ("num_local_experts", "num_experts_per_tok",
                                                                          "router_aux_loss_coef", "convert_from",
                                                                          "num_attention_heads", "num_key_value_heads")})
            cfg = model_config(recipe, tok)
            log.info("%s: %s parameters", name, f"{CausalLM(cfg).num_parameters():,}")
            model, summary = train_one(name, recipe, cfg, streams, args, run_dir)
            if not args.no_ship:
                dest = out_dir / name if name in TRAIN_ORDER else arch_train.model_folder(name, out_dir, run_dir)
                save_checkpoint(model, tok, dest, dtype=torch.float16,
                                extra_files={"tokenizer_config.json": _tokenizer_config(cfg)})
                log.info("%s: saved to %s", name, dest)
    if not args.no_ship:
        if pair:
            finish(out_dir, run_dir, names, info, args)
        arch_train.finish(out_dir, run_dir, [n for n in names if n not in TRAIN_ORDER], info, args)
    return 0


def _tokenizer_config(cfg: ModelConfig) -> str:
    """Lets transformers' AutoTokenizer open the folder too."""
    return json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOT, "eos_token": EOT,
                       "unk_token": None, "model_max_length": cfg.max_position_embeddings,
                       "clean_up_tokenization_spaces": False}, indent=1) + "\n"


if __name__ == "__main__":
    sys.exit(main())
