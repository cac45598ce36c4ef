"""``inferlab train eagle --target smollm2``: an EAGLE draft on the frozen target (Li et al. 2024).

Four resumable stages, each writing to ``--run-dir`` (rerun the same command to go on):

0. **prompts** (``prompts.json``): half are built offline from templates over the Python standard
   library (its functions and docstrings), the capstone's customer-service questions and lists of
   everyday topics; the other half the target writes itself, as Magpie does (Xu et al. 2024): given
   only the chat template's opening of a user turn, an instruction-tuned model samples a request
   of the kind it was tuned on. Those cover the open-ended chat the templates cannot.
1. **answers** (``answers.jsonl``): the target answers training prompts, greedily, through the
   engine (EAGLE trains on the target's own outputs, so the draft learns the distribution it will
   be checked against). No prompt is in ``inferlab/bench/spec_prompts.json``, the benchmark's
   held-out set, and 5% of them are held out here too.
2. **features** (``features.safetensors``): one teacher-forced target forward over each
   prompt + answer gives f_t, its last decoder layer's output at every position.
3. **train**: the draft reads [embed(x_t), f_{t-1}] and learns f^_t ~ f_t (smooth L1 on features
   divided by their RMS) and x_{t+1} from head(norm(f^_t)) (cross-entropy over the draft
   vocabulary), on answer positions. A second pass feeds the draft its own f^ (as drafting step 2
   does) and is trained the same way (EAGLE-3's training-time test, one step deep). Checkpoints
   go to ``eagle_ckpt.pt`` every 50 steps.

The draft vocabulary is the ``--draft-vocab`` tokens most frequent in the training answers. The
layer starts from the target's last decoder layer, the head from the target's rows of those
tokens, the norm from the target's final norm. The card records held-out top-1 agreement with
the target at drafting steps 1 and 2, the draft's cost c against one target decode step, and the
time each stage took.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import random
import re
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from inferlab.cli import add_quantization_argument
from inferlab.errors import InferlabError
from inferlab.spec.eagle import EagleDraft, eagle_folder_for, last_layer_features, save_eagle

log = logging.getLogger("inferlab.eagle")

CODE_TASKS = ["Explain what this Python code does:\n\n```python\n{x}\n```",
              "Add type hints to this function and return it:\n\n```python\n{x}\n```",
              "Write a docstring for this function:\n\n```python\n{x}\n```",
              "Suggest a better name for each variable in this code:\n\n```python\n{x}\n```",
              "Is there a bug in this code? Explain.\n\n```python\n{x}\n```",
              "Rewrite this function to be easier to read:\n\n```python\n{x}\n```"]
DOC_TASKS = ["Summarize this documentation in two sentences:\n\n{x}",
             "Explain this in simple words:\n\n{x}",
             "List the key points of this text:\n\n{x}",
             "What is this text about?\n\n{x}"]
TOPIC_TASKS = ["Write a short story about {x}.", "Explain {x} to a child.", "Give three facts about {x}.",
               "Write a short poem about {x}.", "What are the pros and cons of {x}?", "Describe {x} in a few sentences.",
               "Why do people like {x}?", "Write a short blog post about {x}."]
TOPICS = ["a dragon who loves books", "volcanoes", "the moon landing", "learning a new language", "a busy train station",
          "electric cars", "honeybees", "a rainy Monday", "the history of bread", "saving money", "mountain climbing",
          "a robot who wants to paint", "the water cycle", "chess", "working from home", "a lost umbrella",
          "recycling", "jazz music", "the first day at a new school", "penguins", "coffee", "solar panels",
          "a small village by a river", "friendship", "time travel", "gardening on a balcony", "the internet",
          "a kind stranger", "deserts", "board games", "running a marathon", "a haunted library", "vaccines",
          "cooking pasta", "a city at dawn", "whales", "public libraries", "a snowstorm", "teamwork", "maps"]


def _functions(text: str) -> list[str]:
    """Top-level functions of a source file, 4 to 25 lines long."""
    out = []
    for m in re.finditer(r"^def .*?(?=^\S|\Z)", text, re.S | re.M):
        body = m.group(0).rstrip()
        if 4 <= body.count("\n") + 1 <= 25:
            out.append(body)
    return out


def _docstrings(text: str) -> list[str]:
    return [d.strip() for d in re.findall(r'"""(.*?)"""', text, re.S) if 150 <= len(d.strip()) <= 700]


def training_prompts(n: int, seed: int) -> list[str]:
    """``n`` user messages: code and documentation tasks over the standard library's train split,
    customer-service questions and everyday topics (none of the benchmark's held-out prompts)."""
    from inferlab.corpus import load_corpus

    rng = random.Random(seed)
    funcs, docs = [], []
    for f in load_corpus("train"):
        funcs += _functions(f.text)
        docs += _docstrings(f.text)
    cs = json.loads((Path(__file__).parents[1] / "strategy" / "customer_service.json").read_text())
    questions = [q for i in cs["intents"] for q in i["questions"]] + list(cs["out_of_scope"])
    out, seen, i = [], set(), 0
    limit = len(TOPIC_TASKS) * len(TOPICS) + len(questions)  # the kinds that can repeat
    while len(out) < n:  # no prompt twice: a repeat in the held-out 5% would score memorised answers
        r = i % 10
        i += 1
        if r < 4:
            text = rng.choice(CODE_TASKS).format(x=rng.choice(funcs))
        elif r < 6:
            text = rng.choice(DOC_TASKS).format(x=rng.choice(docs))
        elif r < 8 and len(seen) < limit:
            text = rng.choice(TOPIC_TASKS).format(x=rng.choice(TOPICS))
        else:
            text = rng.choice(questions)
        if text not in seen:
            seen.add(text)
            out.append(text)
        if i > 50 * n:
            raise InferlabError(f"cannot build {n} distinct prompts from the corpus: ask for fewer")
    return out


def magpie_prompts(llm, n: int, seed: int, max_tokens: int = 96, quiet: bool = False) -> list[str]:
    """``n`` distinct user requests the target writes itself (Magpie, Xu et al. 2024): the prompt is
    the chat template cut where a user's message would begin, sampled at temperature 1 until the
    end of the turn. Unfinished requests, very short ones and the benchmark's held-out prompts are
    dropped; each round seeds its requests, so a rerun writes the same list."""
    from inferlab.bench.spec import PROMPT_SETS
    from inferlab.model.chat import Chat
    from inferlab.sampling import SamplingParams

    def key(text: str) -> str:  # the same request, whatever its spacing and case
        return " ".join(text.split()).lower()

    chat = Chat(llm.tokenizer)
    if chat.template.is_default:
        raise InferlabError("the target has no chat template, so it cannot write requests itself: pass --magpie 0")
    mark = "\u2063inferlab\u2063"
    text, _ = chat.prompt([{"role": "user", "content": mark}])
    opening = llm.tokenizer.encode(text[:text.index(mark)], add_special_tokens=False)  # the template wrote them
    sets = json.loads(PROMPT_SETS.read_text())
    held = {key(q) for q in sets["grounded"] + sets["free"]}
    out, seen, rnd = [], set(), 0
    bar = tqdm(total=n, desc="magpie prompts", unit="prompt", disable=quiet)
    while len(out) < n:
        params = [chat.sampling_params(SamplingParams(temperature=1.0, max_tokens=max_tokens,
                                                      seed=seed * 1_000_003 + rnd * 64 + i)) for i in range(64)]
        rnd += 1
        for o in llm.generate(prompt_token_ids=[opening] * 64, sampling_params=params):
            q = o.outputs[0].text.strip()
            k = key(q)
            if o.outputs[0].finish_reason == "stop" and len(q) >= 20 and k not in seen and k not in held:
                seen.add(k)
                out.append(q)
                bar.update(1)
        if rnd > 10 + 4 * n // 64:
            raise InferlabError(f"the target wrote too few usable requests ({len(out)} of {n}): ask for fewer prompts")
    bar.close()
    return out[:n]


def prompt_stage(llm, run_dir: Path, n: int, seed: int, magpie: float, quiet: bool = False) -> list[str]:
    """The training prompts, written once to prompts.json: ``magpie`` of them from the target
    (:func:`magpie_prompts`), the rest from the templates, interleaved so the held-out 5% at the
    end holds both kinds."""
    path = run_dir / "prompts.json"
    if path.exists():
        stored = json.loads(path.read_text())
        if len(stored) == n:
            return stored
        raise InferlabError(f"{path} holds {len(stored)} prompts, not {n}: pass --prompts {len(stored)}, "
                            "or a new --run-dir")
    m = round(n * magpie)
    own = magpie_prompts(llm, m, seed, quiet=quiet) if m else []
    built = training_prompts(n - m, seed)
    prompts, i, j = [], 0, 0
    while len(prompts) < n:  # interleave in proportion
        if j < len(own) and (i >= len(built) or j * len(built) <= i * len(own)):
            prompts.append(own[j])
            j += 1
        else:
            prompts.append(built[i])
            i += 1
    path.write_text(json.dumps(prompts, indent=0))
    return prompts


# ---------------------------------------------------------------- stage 1: the target's answers

def read_answers(run_dir: Path) -> list[dict]:
    """The answers written so far: {"prompt", "prompt_ids", "answer_ids"} per line of answers.jsonl."""
    path = Path(run_dir) / "answers.jsonl"
    if not path.exists():
        raise InferlabError(f"no answers in {run_dir}: run `inferlab train eagle --run-dir {run_dir}` first "
                            "(its first stage writes the target's answers)")
    return [json.loads(line) for line in path.read_text().splitlines()]


def answer_stage(llm, run_dir: Path, prompts: list[str], max_tokens: int, chunk: int = 64, quiet: bool = False) -> list[dict]:
    """The target's greedy answer to every prompt, appended to answers.jsonl chunk by chunk (a
    rerun goes on from the last chunk written)."""
    from inferlab.model.chat import Chat
    from inferlab.sampling import SamplingParams

    path = run_dir / "answers.jsonl"
    done = read_answers(run_dir) if path.exists() else []
    chat = Chat(llm.tokenizer)
    params = chat.sampling_params(SamplingParams(temperature=0, max_tokens=max_tokens))
    bar = tqdm(total=len(prompts), initial=len(done), desc="target answers", unit="prompt", disable=quiet)
    with path.open("a") as f:
        for lo in range(len(done), len(prompts), chunk):
            batch = prompts[lo:lo + chunk]
            ids = [chat.prompt([{"role": "user", "content": p}])[1] for p in batch]
            outs = llm.generate(prompt_token_ids=ids, sampling_params=params)
            for p, i, o in zip(batch, ids, outs):
                rec = {"prompt": p, "prompt_ids": i, "answer_ids": list(o.outputs[0].token_ids)}
                f.write(json.dumps(rec) + "\n")
                done.append(rec)
            f.flush()
            bar.update(len(batch))
            log.info("answers: %d/%d", len(done), len(prompts))
    bar.close()
    return done


# ---------------------------------------------------------------- stage 2: the target's features

@torch.no_grad()
def feature_stage(target, run_dir: Path, samples: list[dict], quiet: bool = False) -> list[torch.Tensor]:
    """f_t (the last decoder layer's output) at every position of each prompt + answer, fp16."""
    path = run_dir / "features.safetensors"
    if path.exists():
        stored = load_file(str(path))
        if len(stored) == len(samples):
            return [stored[str(i)] for i in range(len(samples))]
    feats = []
    for rec in tqdm(samples, desc="target features", unit="sample", disable=quiet):
        ids = torch.tensor([rec["prompt_ids"] + rec["answer_ids"]])
        with last_layer_features(target) as seen:
            target(ids, last_only=True)
        feats.append(seen[-1][0].half().clone())
    save_file({str(i): f for i, f in enumerate(feats)}, str(path))
    return feats


def draft_vocabulary(samples: list[dict], size: int, always: tuple[int, ...]) -> torch.Tensor:
    """The ``size`` tokens most frequent in the answers (``always`` included), sorted by id."""
    counts = torch.zeros(max(max(r["answer_ids"] + list(always) + [0]) for r in samples) + 1, dtype=torch.long)
    for r in samples:
        counts += torch.bincount(torch.tensor(r["answer_ids"] or [0], dtype=torch.long), minlength=len(counts))[:len(counts)]
    counts[list(always)] = counts.max() + 1
    return torch.sort(torch.topk(counts, min(size, int((counts > 0).sum()))).indices).values


# ---------------------------------------------------------------- stage 3: the draft

def init_draft(target, d2t: torch.Tensor) -> EagleDraft:
    """The layer from the target's last one, the head from its rows of the draft vocabulary."""
    draft = EagleDraft(target.config, d2t)
    draft.layer.load_state_dict(target.model.layers[-1].state_dict())
    draft.norm.load_state_dict(target.model.norm.state_dict())
    with torch.no_grad():
        draft.lm_head.weight.copy_(target.lm_head.weight[d2t])
        h = target.config.hidden_size
        draft.fc.weight.normal_(0, 0.02 / h ** 0.5)
        draft.fc.weight[:, h:] += torch.eye(h)  # start by passing the feature through
        draft.fc.bias.zero_()
    return draft


def _batch(target, samples, feats, idx, t2d):
    """Padded inputs of samples ``idx``: embeds [B, T, H], f_{t-1} [B, T, H], f_t, labels [B, T]
    (the draft id of x_{t+1} on answer positions, -100 elsewhere)."""
    lens = [len(samples[i]["prompt_ids"]) + len(samples[i]["answer_ids"]) for i in idx]
    t = max(lens)
    h = target.config.hidden_size
    ids = torch.zeros(len(idx), t, dtype=torch.long)
    prev, cur = torch.zeros(len(idx), t, h), torch.zeros(len(idx), t, h)
    labels = torch.full((len(idx), t), -100, dtype=torch.long)
    for b, i in enumerate(idx):
        r, n = samples[i], lens[b]
        seq = torch.tensor(r["prompt_ids"] + r["answer_ids"])
        ids[b, :n] = seq
        f = feats[i].float()
        cur[b, :n] = f
        prev[b, 1:n] = f[:n - 1]
        p = len(r["prompt_ids"])
        labels[b, p - 1:n - 1] = t2d[seq[p:n]]  # x_{t+1} for t in the answer (and the token before it)
    with torch.no_grad():
        embeds = target.model.embed_tokens(ids)
    return embeds, prev, cur, labels


def draft_losses(draft, embeds, prev, cur, labels, passes: int = 2):
    """Per drafting pass: (feature loss, cross-entropy, top-1 agreement) on the labelled positions."""
    mask = labels >= 0
    scale = cur[mask].pow(2).mean().sqrt()
    out, feats = [], prev
    for _ in range(passes):
        pred = draft(embeds, feats)
        logits = draft.logits(pred)
        reg = F.smooth_l1_loss(pred[mask] / scale, cur[mask] / scale)
        ce = F.cross_entropy(logits[mask], labels[mask])
        top1 = (logits[mask].argmax(-1) == labels[mask]).float().mean()
        out.append((reg, ce, top1))
        feats = torch.cat([torch.zeros_like(pred[:, :1]), pred[:, :-1]], 1)  # the draft's own f^_{t-1}
    return out


@torch.no_grad()
def evaluate(draft, target, samples, feats, t2d, batch_size: int = 8) -> dict:
    hits, ces, n = [0.0, 0.0], [0.0, 0.0], 0
    covered = total = 0
    for lo in range(0, len(samples), batch_size):
        idx = list(range(lo, min(lo + batch_size, len(samples))))
        embeds, prev, cur, labels = _batch(target, samples, feats, idx, t2d)
        m = int((labels >= 0).sum())
        for k, (_, ce, top1) in enumerate(draft_losses(draft, embeds, prev, cur, labels)):
            hits[k] += float(top1) * m
            ces[k] += float(ce) * m
        n += m
        for i in idx:
            a = torch.tensor(samples[i]["answer_ids"])
            covered += int((t2d[a] >= 0).sum())
            total += len(a)
    return {"positions": n, "top1_step1": round(hits[0] / n, 4), "top1_step2": round(hits[1] / n, 4),
            "ce_step1": round(ces[0] / n, 4), "ce_step2": round(ces[1] / n, 4),
            "draft_vocab_coverage": round(covered / max(total, 1), 4)}


def resume(ckpt: Path, module, opt, strict: bool = True) -> tuple[int, float]:
    """Load the checkpoint a stopped run left (``{"draft", "opt", "step", "seconds"}``) into
    ``module`` and ``opt``; returns (steps done, seconds spent), (0, 0.0) for a fresh run."""
    if not ckpt.exists():
        return 0, 0.0
    state = torch.load(ckpt, weights_only=True)
    module.load_state_dict(state["draft"], strict=strict)
    opt.load_state_dict(state["opt"])
    return state["step"], state["seconds"]


def length_buckets(samples, batch_size: int) -> list[list[int]]:
    """Sample indices in groups of ``batch_size`` of similar length (prompt + answer): a batch
    drawn from one group pads little."""
    order = sorted(range(len(samples)), key=lambda i: len(samples[i]["prompt_ids"]) + len(samples[i]["answer_ids"]))
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def set_lr(opt, lr: float, step: int, steps: int) -> None:
    """Linear warmup over the first 5% of ``steps``, then cosine decay to 5% of ``lr``."""
    warmup = max(1, steps // 20)
    for g in opt.param_groups:
        g["lr"] = lr * (step + 1) / warmup if step < warmup else \
            lr * (0.05 + 0.475 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))


def train_stage(draft, target, samples, feats, t2d, steps: int, lr: float, batch_size: int, w_ce: float,
                run_dir: Path, seed: int, quiet: bool = False) -> float:
    """AdamW with warmup and cosine decay; resumes from eagle_ckpt.pt. Returns the seconds it trained."""
    ckpt = run_dir / "eagle_ckpt.pt"
    opt = torch.optim.AdamW(draft.parameters(), lr=lr, weight_decay=0.0)
    start, spent = resume(ckpt, draft, opt)
    buckets = length_buckets(samples, batch_size)
    draft.train()
    t0, ema = time.monotonic(), None
    bar = tqdm(range(start, steps), desc="eagle draft", unit="step", disable=quiet, initial=start, total=steps)
    for step in bar:
        idx = random.Random(seed * 100003 + step).choice(buckets)
        set_lr(opt, lr, step, steps)
        embeds, prev, cur, labels = _batch(target, samples, feats, idx, t2d)
        losses = draft_losses(draft, embeds, prev, cur, labels)
        loss = sum((reg + w_ce * ce) * (1.0 if k == 0 else 0.5) for k, (reg, ce, _) in enumerate(losses))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        cur_stats = [losses[0][1].item(), losses[0][2].item(), losses[1][2].item()]
        ema = cur_stats if ema is None else [0.95 * e + 0.05 * c for e, c in zip(ema, cur_stats)]
        bar.set_postfix(ce=f"{ema[0]:.2f}", top1=f"{ema[1]:.2f}/{ema[2]:.2f}", refresh=False)
        if (step + 1) % 50 == 0 or step + 1 == steps:
            seconds = spent + time.monotonic() - t0
            torch.save({"draft": draft.state_dict(), "opt": opt.state_dict(), "step": step + 1, "seconds": seconds}, ckpt)
            log.info("step %d/%d  ce %.3f  top1 step1 %.3f step2 %.3f  %.0fs", step + 1, steps, *ema, seconds)
    draft.eval()
    return spent + time.monotonic() - t0


def model_card(s: dict) -> str:
    e = s["held_out"]
    return f"""# inferlab/{s['base_model']}_eagle

An EAGLE draft (Li et al., ICML 2024) for `{s['base_model']}`: one decoder layer over
[embed(x_t), f_(t-1)], where f is the target's last-layer feature, predicting f_t; its head reads
a draft vocabulary of the {s['draft_vocab_size']:,} tokens the target's answers use most
({e['draft_vocab_coverage']:.1%} of held-out answer tokens lie in it). The target's embedding is
shared, not stored: {s['parameters']:,} parameters ship, {s['stored_mb']:.1f} MB in fp16.

Trained by `{s.get('command', 'inferlab train eagle')}` on the frozen target ({s.get('quantization') or 'as stored'})
and its own greedy answers to {s['train_prompts']:,} prompts: {s.get('magpie', 0):.0%} of them requests the target
wrote itself (Magpie, Xu et al. 2024), the rest built offline from templates (standard-library
code and docstrings, customer-service questions, everyday topics); none is from the benchmark's
held-out set. {s['train_tokens']:,} answer tokens, {s['steps']} steps of {s['batch_size']} answers,
AdamW at {s['lr']}, seed {s['seed']}. Time on this machine's CPU (2 threads), summed over the runs that
made it (each stage resumes where a stopped run left off): prompts {s['seconds'].get('prompts', 0):.0f} s,
answers {s['seconds']['answers']:.0f} s, features {s['seconds']['features']:.0f} s, training {s['seconds']['train']:.0f} s.

Held out ({e['positions']:,} answer positions of {s['held_out_prompts']} prompts no step saw):

| drafting step | input feature | top-1 = target's next token |
|---|---|---|
| 1 | the target's f_(t-1) | {e['top1_step1']:.1%} |
| 2 | the draft's own f^_(t-1) | {e['top1_step2']:.1%} |

Draft cost c (one drafting pass over one target decode step, both as the engine runs them, timed in
turn, batch 1, fp32): {s['draft_cost_ratio']:.3f}.
Speed-ups measured in the engine: `inferlab bench spec --target {s['base_model']}`.

Use: `LLM("{s['base_model']}", speculative_config={{"method": "eagle", "num_speculative_tokens": 3}})`.
"""


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="inferlab train eagle", description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2", help="the frozen target (default: smollm2)")
    p.add_argument("--prompts", type=int, default=1600, help="training prompts (default: 1600)")
    p.add_argument("--max-tokens", type=int, default=160, help="tokens per answer (default: 160)")
    p.add_argument("--draft-vocab", type=int, default=4096, help="draft vocabulary size (default: 4096)")
    p.add_argument("--steps", type=int, default=1200, help="optimizer steps (default: 1200)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default: 1e-3)")
    p.add_argument("--batch-size", type=int, default=8, help="answers per step (default: 8)")
    p.add_argument("--ce-weight", type=float, default=0.5, help="weight of the cross-entropy (default: 0.5)")
    p.add_argument("--magpie", type=float, default=0.5,
                   help="share of the prompts the target writes itself, Magpie's way (default: 0.5)")
    p.add_argument("--seed", type=int, default=0)
    add_quantization_argument(p, "the target whose answers and features the draft learns: ")
    p.add_argument("--run-dir", default="runs/eagle", help="answers, features, checkpoints, log (default: runs/eagle)")
    p.add_argument("--out", default=None, help="where the draft goes (default: inferlab/assets/models/<target>_eagle)")
    p.add_argument("--no-ship", action="store_true", help="measure only; do not write the draft")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    if min(args.prompts, args.max_tokens, args.draft_vocab, args.steps, args.batch_size) < 1 or args.prompts < 20:
        raise InferlabError("--prompts must be >= 20, and --max-tokens, --draft-vocab, --steps, --batch-size >= 1")
    if not 0 <= args.magpie <= 1:
        raise InferlabError(f"--magpie is a share of the prompts, between 0 and 1: got {args.magpie}")
    from inferlab.bench.spec import costs
    from inferlab.llm import LLM, load_model

    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        handlers=[logging.StreamHandler(), logging.FileHandler(run_dir / "eagle.log")])
    torch.manual_seed(args.seed)
    seconds = json.loads((run_dir / "seconds.json").read_text()) if (run_dir / "seconds.json").exists() else {}
    llm = LLM(args.target, quantization=args.quantization, max_num_seqs=32)
    target = llm.model.eval().requires_grad_(False)
    t = time.monotonic()
    prompts = prompt_stage(llm, run_dir, args.prompts, args.seed, args.magpie, args.quiet)
    seconds["prompts"] = seconds.get("prompts", 0.0) + time.monotonic() - t
    t = time.monotonic()
    samples = answer_stage(llm, run_dir, prompts, args.max_tokens, quiet=args.quiet)
    seconds["answers"] = seconds.get("answers", 0.0) + time.monotonic() - t
    (run_dir / "seconds.json").write_text(json.dumps(seconds))
    t = time.monotonic()
    feats = feature_stage(target, run_dir, samples, args.quiet)
    seconds["features"] = seconds.get("features", 0.0) + time.monotonic() - t
    (run_dir / "seconds.json").write_text(json.dumps(seconds))
    held = max(1, len(samples) // 20)  # the last 5% of prompts: held out
    train_s, test_s = samples[:-held], samples[-held:]
    train_f, test_f = feats[:-held], feats[-held:]
    eot = tuple(llm.llm_engine.eos_token_ids)
    d2t = draft_vocabulary(train_s, args.draft_vocab, eot)
    t2d = torch.full((target.config.vocab_size,), -100, dtype=torch.long)
    t2d[d2t] = torch.arange(len(d2t))
    # the layer and head start from the target's fp32 weights (a quantized target holds blocks)
    fp32 = target if args.quantization == "none" else load_model(args.target, "cpu", quantization="none")[0]
    draft = init_draft(fp32, d2t)
    del fp32
    seconds["train"] = train_stage(draft, target, train_s, train_f, t2d, args.steps, args.lr, args.batch_size,
                                   args.ce_weight, run_dir, args.seed, args.quiet)
    held_out = evaluate(draft, target, test_s, test_f, t2d)
    log.info("held out: %s", held_out)
    params = sum(v.numel() for k, v in draft.state_dict().items() if k != "d2t")
    summary = {"method": "EAGLE-1 chain draft: one decoder layer over [embed(x_t), f_(t-1)], draft vocabulary head",
               "base_model": args.target, "draft_vocab_size": len(d2t), "parameters": params,
               "stored_mb": params * 2 / 1e6, "train_prompts": len(train_s), "held_out_prompts": len(test_s),
               "train_tokens": sum(len(r["answer_ids"]) for r in train_s), "steps": args.steps,
               "batch_size": args.batch_size, "lr": args.lr, "ce_weight": args.ce_weight, "seed": args.seed,
               "max_tokens": args.max_tokens, "magpie": args.magpie, "quantization": args.quantization, "seconds": {k: round(v, 1) for k, v in seconds.items()},
               "held_out": held_out, "draft_cost_ratio": round(costs(target, 128, (), 20, eagle=draft)["eagle"], 4),
               "threads": torch.get_num_threads(), "command": " ".join(["inferlab train eagle", *argv])}
    print(json.dumps(summary))
    if not args.no_ship:
        out = Path(args.out) if args.out else eagle_folder_for(args.target)
        save_eagle(draft, out, args.target, {"README.md": model_card(summary),
                                             "metrics.json": json.dumps(summary, indent=1) + "\n"})
        log.info("saved to %s", out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(__import__("sys").argv[1:]))
