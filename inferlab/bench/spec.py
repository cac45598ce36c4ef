"""Speculative decoding at batch 1: measured speedup beside Leviathan's prediction.

Greedy, on prompts cut from held-out files of the corpus (the ``test`` split: code the models
never trained on). Per method and k: tokens/s against plain decoding on the same contiguous
path (timed alternately, best of ``--repeats``), the acceptance rate (guesses kept / proposed,
vLLM's), the mean acceptance length L (tokens per verify step) and the per-position acceptance a
of Leviathan's formula (the a with (1 - a^(k+1)) / (1 - a) = L), the draft's cost c (one draft forward over one target forward), the verify cost v (a
(k+1)-token target forward over a 1-token one), and the speedup the formula predicts from them:
(1 - a^(k+1)) / ((1 - a)(k c + v)). ``outputs_identical`` checks every output against plain
decoding. The first table runs the contiguous reference loop (``inferlab.spec.reference``).

Medusa rows (``medusa``) use the heads shipped beside the target (``target_medusa``): their c is
the cost of one head (residual block + lm_head) per guess, over one target forward.

The second (``engine``) runs speculation (n-gram, the draft model, Medusa) as a mode of the engine's
step at batch sizes 1, 4 and 16: the same held-out prompts, all submitted at once, against the engine without speculation
(same knobs, the runs side by side, the one behind in tokens taking the next step, the median of ``--repeats``). Each row reports the verify steps saved,
the speedup of the whole run and of its decode steps alone, and the formula's prediction with
a, c and v measured at that batch size (c and v against one decode step of the whole batch),
priced over the share f of a sequence's steps that had guesses, (f L + 1 - f) / (f (k c + v) + 1 - f);
as the batch fills, speculation pays less (vLLM's blog reports slowdowns at high load): a batch
decodes for as many steps as its slowest sequence, so the steps saved shrink, while every verify
step still costs more than a plain one.

Each row also carries ``engine``: the formula's terms as the engine's own steps measured them
(``inferlab.bench.step_profile``): v as a verify forward over a plain one on the paged path, the
proposer's work per step, the share of steps that had guesses at all (prompt lookup finds none on
some steps; Leviathan's formula assumes k every step) and the decode steps' measured speedup. At
batch 1 the prediction from these and the measured decode speedup agree to a few percent, and the
step's breakdown shows what is left: the forward, not the bookkeeping around it. (In a batch the
steps are shared and the per-sequence formula overstates the saving.) The engine here is the one
``LLM`` runs (projections packed, steps eager).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import time
from pathlib import Path

import torch

from inferlab.attention.paged import MULTI_QUERY_MAX
from inferlab.bench.stats import best_times
from inferlab.corpus import load_corpus
from inferlab.cache import PagedKVCache
from inferlab.engine.config import CPU_KV_CACHE_BYTES, EngineConfig
from inferlab.engine.llm_engine import LLMEngine
from inferlab.engine.spec_decode import draft_model
from inferlab.generate import generate
from inferlab.llm import load_model
from inferlab.model.loader import load_checkpoint
from inferlab.sampling import SamplingParams
from inferlab.errors import InferlabError
from inferlab.spec import layer_draft
from inferlab.spec.medusa import MedusaGuesser, beside_target, heads_folder_for, load_heads
from inferlab.spec.ngram import NgramProposer, copy_ceiling
from inferlab.spec.reference import DraftModelProposer, _forward, speculative_generate
from inferlab.spec.rejection import alpha_from_tokens_per_step, mixed_speedup, predicted_speedup


def held_out_prompts(tokenizer, n: int, prompt_tokens: int) -> list[list[int]]:
    """The first ``prompt_tokens`` tokens of n held-out files long enough to give them."""
    prompts = []
    for f in load_corpus("test"):
        ids = tokenizer.encode(f.text)
        if len(ids) >= prompt_tokens + 64:
            prompts.append(ids[:prompt_tokens])
        if len(prompts) == n:
            break
    return prompts


PROMPT_SETS = Path(__file__).with_name("spec_prompts.json")


def chat_prompts(tokenizer, name: str, n: int | None = None) -> list[list[int]]:
    """The held-out set ``name`` ("grounded" or "free", ``spec_prompts.json``) as chat prompts
    through the model's own template: one user message each."""
    from inferlab.model.chat import Chat

    sets = json.loads(PROMPT_SETS.read_text())
    if name not in sets or name == "about":
        raise InferlabError(f"unknown prompt set {name!r}: choose code, grounded or free")
    chat = Chat(tokenizer)
    return [chat.prompt([{"role": "user", "content": text}])[1] for text in sets[name][:n]]


class PagedPool:
    """One paged KV cache and model runner for ``model``, as the engine keeps one: every timed
    function of :func:`costs` takes its sequences' block tables from it."""

    def __init__(self, model, context: int, sequences: int, block_size: int = 16, dtype=None):
        from inferlab.engine.model_runner import ModelRunner

        self.per_seq = -(-(context + MULTI_QUERY_MAX) // block_size)
        self.cache = PagedKVCache.for_model(model.config, 1 + sequences * self.per_seq, block_size,
                                            dtype or model.dtype, model.device)
        self.runner = ModelRunner(model, self.cache)
        self.next = 1  # block 0 stays free: padding in the block tables points there

    def tables(self, batch: int) -> list[list[int]]:
        first, self.next = self.next, self.next + batch * self.per_seq
        if self.next > self.cache.num_blocks:
            raise ValueError(f"the pool holds {self.cache.num_blocks} blocks: make it for more sequences")
        return [list(range(first + i * self.per_seq, first + (i + 1) * self.per_seq)) for i in range(batch)]


def forward_step(model, tokens: int, context: int, batch: int = 1, pool: PagedPool | None = None):
    """One forward of ``tokens`` new tokens for each of ``batch`` sequences over ``context`` cached
    ones (a verify step of the batch when tokens = k + 1, a decode when 1), as a function to time:
    the context is prefilled here, and each call writes the same positions again.

    With ``pool`` (a :class:`PagedPool` of ``model``), the engine's path: ``ModelRunner.execute``
    over the paged cache with the logits of every new row, as a verify step runs, so the layers run
    in one C call. Without, the module path on a contiguous cache, as the reference loop runs."""
    if pool is not None:
        from inferlab.engine.model_runner import SeqInput

        tables = pool.tables(batch)
        pool.runner.execute([SeqInput([1] * context, 0, t) for t in tables])
        seqs = [SeqInput([1] * tokens, context, t) for t in tables]
        return lambda: pool.runner.execute(seqs, num_logits=[tokens] * batch)
    from inferlab.attention import AttentionMetadata
    from inferlab.cache import ContiguousKVCache

    cache = ContiguousKVCache.for_model(model.config, batch, context + tokens, model.dtype, model.device)

    @torch.inference_mode()
    def forward(n: int = tokens, start: int = context):
        ids = torch.ones(batch, n, dtype=torch.long, device=model.device)
        pos = torch.arange(start, start + n, device=model.device)[None].expand(batch, n)
        return model(ids, AttentionMetadata(positions=pos, kv_cache=cache, cache_start=start), last_only=True)

    forward(context, 0)
    return forward


def eagle_step(eagle, model, context: int, batch: int = 1):
    """One EAGLE drafting pass as the engine's proposer runs it (``inferlab.engine.eagle``): the
    layer over one new row of each of ``batch`` sequences on the draft's paged cache (``context``
    positions cached), then the draft's head and its argmax, as a function to time."""
    from inferlab.engine.model_runner import SeqInput

    pool = PagedPool(eagle, context, batch, dtype=model.dtype)
    tables, h = pool.tables(batch), model.config.hidden_size

    @torch.inference_mode()
    def drafting(inputs: list | None = None):
        inputs = inputs or [SeqInput([1], context, t) for t in tables]
        ids, meta, last, _ = pool.runner.prepare(inputs)
        feats = torch.zeros(1, ids.shape[1], h, dtype=model.dtype, device=model.device)
        return eagle.logits(eagle(model.model.embed_tokens(ids), feats, meta)[0, last]).argmax(-1)

    drafting([SeqInput([1] * context, 0, t) for t in tables])
    return drafting


def heads_step(model, heads, k: int, batch: int = 1):
    """The k Medusa heads on ``batch`` hidden states, as a function to time (Medusa's c is its time / k)."""
    h = torch.zeros(batch, model.config.hidden_size, dtype=model.dtype, device=model.device)
    return lambda: heads.propose(h, model.lm_head, k)


def costs(model, context: int, ks, repeats: int, batch: int = 1, draft=None, eagle=None, heads=None,
          medusa_ks=(), paged: bool = True) -> dict:
    """Leviathan's c and v measured off the engine, against one decode step of the target: a verify
    of k + 1 rows for each k (``("verify", k)``), a draft model's forward (``"draft"``), an EAGLE
    drafting pass (``"eagle"``), Medusa's heads per guess (``("medusa", k)``). Every forward is timed
    in turn with the others, best of ``repeats`` each (``stats.best_times``).

    ``paged``: each forward on the engine's path (:func:`forward_step` with a pool, one per model;
    EAGLE's pass as its proposer runs it); otherwise on the module path of the contiguous reference
    loop. The two differ: on smollm2 as stored the module path's fixed cost per layer (a Python call
    per operation) is 2-3x the C layers' whole step, and hides what a verify's extra rows cost (v of
    4 rows: 1.10 there, 1.36 on the engine's path)."""
    pools = {}
    if paged:
        per = 1 + len(ks)
        pools = {"target": PagedPool(model, context, per * batch)}
        if draft is not None:
            pools["draft"] = PagedPool(draft, context, batch)
    fns = {"one": forward_step(model, 1, context, batch, pools.get("target"))}
    fns.update({("verify", k): forward_step(model, k + 1, context, batch, pools.get("target")) for k in ks})
    if draft is not None:
        fns["draft"] = forward_step(draft, 1, context, batch, pools.get("draft"))
    if eagle is not None:
        from inferlab.spec.eagle import drafting_step

        fns["eagle"] = eagle_step(eagle, model, context, batch) if paged else drafting_step(eagle, model, context, batch)
    if heads is not None:
        fns.update({("medusa", k): heads_step(model, heads, k, batch) for k in medusa_ks})
    t = best_times(fns, repeats)
    out = {name: t[name] / t["one"] for name in fns if name != "one"}
    out.update({("medusa", k): out[("medusa", k)] / k for k in medusa_ks if heads is not None})  # per guess
    return out


def medusa_heads(target: str, model):
    """The heads shipped beside ``target`` (None, with the reason, where there are none)."""
    try:
        return load_heads(heads_folder_for(target), model.config.hidden_size), None
    except InferlabError as exc:
        return None, str(exc)


def run(target: str = "target", draft: str = "draft", ks=(2, 4), num_prompts: int = 4,
        prompt_tokens: int = 128, new_tokens: int = 64, repeats: int = 2, quantization: str | None = None) -> dict:
    """The contiguous table; ``quantization`` (``LLM``'s) applies to the target, the draft stays as stored."""
    tmodel, tok, _ = load_model(target, "cpu", quantization=quantization)
    dmodel, _ = load_checkpoint(draft, device="cpu")
    heads, no_heads = medusa_heads(target, tmodel)
    prompts = held_out_prompts(tok, num_prompts, prompt_tokens)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    plain_out = [generate(tmodel, [p], [params])[0].output_token_ids for p in prompts]
    methods = [("ngram", k, lambda k=k: NgramProposer(k, 1, 4)) for k in ks]
    methods += [("draft", k, lambda k=k: DraftModelProposer(dmodel, k)) for k in ks]
    if heads is not None:
        methods += [("medusa", k, lambda k=k: MedusaGuesser(tmodel, heads, k)) for k in ks if k <= heads.num_heads]

    def plain():
        for p in prompts:
            generate(tmodel, [p], [params])

    def spec(make):
        stats, outs = [], []
        for p in prompts:
            seq, s = speculative_generate(tmodel, p, params, make())
            outs.append(seq.output_token_ids)
            stats.append(s)
        return outs, stats

    best_plain, best = float("inf"), {}
    plain()  # warm-up
    results = {}
    for _ in range(repeats):  # alternate baseline and methods, keep each one's best
        t = time.perf_counter(); plain(); best_plain = min(best_plain, time.perf_counter() - t)
        for name, k, make in methods:
            t = time.perf_counter(); outs, stats = spec(make); dt = time.perf_counter() - t
            if dt < best.get((name, k), float("inf")):
                best[(name, k)] = dt
                results[(name, k)] = (outs, stats)
    cost = costs(tmodel, prompt_tokens, ks, 20, draft=dmodel, heads=heads,
                 medusa_ks=[k for name, k, _ in methods if name == "medusa"], paged=False)  # the loop's own path
    total_new = new_tokens * len(prompts)
    rows = []
    for name, k, _ in methods:
        outs, stats = results[(name, k)]
        proposed, accepted = sum(s.proposed for s in stats), sum(s.accepted for s in stats)
        a = accepted / max(proposed, 1)
        # prompt lookup's cost is a few array scans; Medusa's, one residual block and lm_head per guess
        c = cost["draft"] if name == "draft" else cost[("medusa", k)] if name == "medusa" else 0.0
        v = cost[("verify", k)]
        length = sum(s.emitted for s in stats) / max(sum(s.steps for s in stats), 1)
        alpha = alpha_from_tokens_per_step(length, k)  # Leviathan's per-position a, not accepted / proposed
        rows.append({"method": name, "num_speculative_tokens": k,
                     "tokens_per_s": total_new / best[(name, k)],
                     "speedup": best_plain / best[(name, k)], "acceptance_rate": a, "alpha": alpha,
                     "mean_acceptance_length": length,
                     "draft_cost_ratio": c, "verify_cost_ratio": v,
                     "predicted_speedup": predicted_speedup(alpha, k, c, v),
                     "outputs_identical": outs == plain_out})
    return {"path": "contiguous reference loop, batch 1, greedy", "target": target, "quantization": quantization,
            "draft": draft,
            "prompts": len(prompts), "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
            "threads": torch.get_num_threads(), "baseline_tokens_per_s": total_new / best_plain,
            "methods": rows, **({"medusa_skipped": no_heads} if heads is None else {})}


def _pool_blocks(prompts, params, seqs: int, block_size: int = 16) -> int:
    """KV blocks for ``seqs`` of these prompts decoding at once, a verify's rows included, with a
    quarter to spare: what a timed run needs, where the engine's default takes up to 1 GiB."""
    longest = max(len(p) for p in prompts) + params.max_tokens + MULTI_QUERY_MAX
    return 2 + seqs * -(-longest // block_size) * 5 // 4


def _engine_runs(model, tok, prompts, params, specs: dict, max_num_seqs: int | None = None) -> dict:
    """Timed runs through fresh engines side by side, one per ``specs`` value (a speculative_config,
    or None for plain decoding): the engine that has emitted the fewest tokens takes the next step,
    until all are done, and each engine's time is the sum of its own steps. The runs then move
    through the same answers together, a speculative one taking a step where plain decoding takes
    one for each token it emits, so a burst of other work on the machine lands on every run in
    proportion. Runs one after the other let a burst slow one of them alone (a plain run slowed 3x
    by a busy core read as a 2.5x speedup of prompt lookup), and so does a step each in turn, which
    leaves plain decoding's extra steps to run alone at the end. Each engine's KV pool holds what
    its prompts need (:func:`_pool_blocks`). Returns {key: (seconds, outputs, counters, step profile)}."""
    from inferlab.bench.step_profile import profile_steps

    seqs = max_num_seqs or max(len(prompts), 1)
    blocks = _pool_blocks(prompts, params, seqs)
    engines = {key: LLMEngine(model, tok, EngineConfig(max_num_seqs=seqs, num_kv_blocks=blocks, speculative_config=spec))
               for key, spec in specs.items()}
    seconds, finals = dict.fromkeys(engines, 0.0), {key: {} for key in engines}
    with contextlib.ExitStack() as stack:
        profs = {key: stack.enter_context(profile_steps(e)) for key, e in engines.items()}
        for e in engines.values():
            for i, p in enumerate(prompts):
                e.add_request(str(i), p, params)
        live = list(engines)
        while live:
            key = min(live, key=lambda k: engines[k].counters["num_generation_tokens"])  # the one behind
            e = engines[key]
            t = time.perf_counter()
            for o in e.step():
                if o.finished:
                    finals[key][o.request_id] = o.outputs[0].token_ids
            seconds[key] += time.perf_counter() - t
            if not e.has_unfinished_requests():
                live.remove(key)
    return {key: (seconds[key], [finals[key][str(i)] for i in range(len(prompts))], e.counters, profs[key])
            for key, e in engines.items()}


def _median_repeat(pairs):
    """The (run, plain run) pair whose decode speedup is the median of ``pairs`` (the lower middle one)."""
    def speedup(pair):
        (_, _, _, prof), (_, _, _, plain_prof) = pair
        return plain_prof.decode_seconds() / max(prof.decode_seconds(), 1e-12)
    return sorted(pairs, key=speedup)[(len(pairs) - 1) // 2]


def engine_table(model, tok, ks=(2, 4), batch_sizes=(1, 4, 16), prompt_tokens: int = 128,
                 new_tokens: int = 64, repeats: int = 3, methods=("ngram", "draft"), draft: str = "draft",
                 medusa: tuple | None = None, eagle: str | None = None, prompts: list[list[int]] | None = None,
                 params: SamplingParams | None = None, module_costs: bool = True,
                 confidence_threshold: float = 0.0) -> list[dict]:
    """Speculation through the engine against the engine without it, per batch size, method and k
    (``medusa``: (the heads' folder, their number), for a "medusa" method: k up to that number;
    ``eagle``: the EAGLE draft's folder, for an "eagle" method).

    Every row carries the formula's terms from the engine's own steps (``engine``). With
    ``module_costs`` it also times c and v off the engine's runs, each forward on its own (as the
    engine runs it, timed in turn: :func:`costs`) (``draft_cost_ratio``, ``verify_cost_ratio``, ``predicted_speedup``); without, those are None
    and the table takes a fraction of the time at larger batches.

    Without ``prompts``, batch size b runs the first b held-out code prompts at once. With
    ``prompts`` (token ids, e.g. ``chat_prompts``) and ``params``, every batch size runs all of
    them, at most b at a time (``max_num_seqs`` = b), and tokens/s counts the tokens emitted."""
    from inferlab.bench.step_profile import engine_terms
    from inferlab.model.packing import pack_projections
    from inferlab.quant.quantize import quantize_like_target
    from inferlab.spec.eagle import load_eagle

    pack_projections(model)  # the engine LLM runs: q/k/v and gate/up as one product each
    runs = [(m, k) for m in methods for k in ks if m != "medusa" or k <= medusa[1]]
    sure = {"confidence_threshold": confidence_threshold}
    configs = {"ngram": lambda k: {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4},
               "draft": lambda k: {"model": draft, "num_speculative_tokens": k, **sure},
               "medusa": lambda k: {"method": "medusa", "num_speculative_tokens": k, "model": str(medusa[0]), **sure},
               "eagle": lambda k: {"method": "eagle", "num_speculative_tokens": k, "model": str(eagle), **sure}}
    given = prompts is not None
    params = params or SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    every = prompts if given else held_out_prompts(tok, max(batch_sizes), prompt_tokens)
    dmodel = draft_model(draft, model) if "draft" in methods else None
    heads = quantize_like_target(load_heads(medusa[0], model.config.hidden_size), model) if "medusa" in methods else None
    edraft = quantize_like_target(load_eagle(eagle, model.config, model.device, model.dtype), model) \
        if "eagle" in methods else None
    rows = []
    for b in batch_sizes:
        prompts = every if given else every[:b]
        seqs = b if given else None
        # warm-up: the loops, plans and caches (a few prompts, a few tokens each)
        _engine_runs(model, tok, prompts[:min(b, 4)], dataclasses.replace(params, max_tokens=min(params.max_tokens, 4)),
                     {None: None}, seqs)
        # plain decoding and the methods side by side, the one behind in tokens stepping next, as many methods at once as
        # fit the engine's own KV budget (each run holds a pool for its prompts; at batch 16 that is
        # 0.4-0.5 GB on smollm2): each method is timed against the plain run beside it
        per_run = _pool_blocks(prompts, params, seqs or len(prompts)) * PagedKVCache.bytes_per_block(
            model.config, 16, model.dtype)
        group = max(1, CPU_KV_CACHE_BYTES // per_run - 1)
        tries = {}  # (method, k) -> [(its run, the plain run beside it)], one per repeat
        for _ in range(repeats):
            for i in range(0, len(runs), group):
                timed = _engine_runs(model, tok, prompts, params,
                                     {None: None, **{(m, k): configs[m](k) for m, k in runs[i:i + group]}}, seqs)
                plain = timed.pop(None)
                for key, run in timed.items():
                    tries.setdefault(key, []).append((run, plain))
        # each method's median repeat by its decode speedup (the lower middle one of an even count): a
        # repeat that a burst of other work slowed on one side moves itself, not the median (a step that
        # stalls outright, 0.2-3 s where a batch-16 step takes 20-30 ms, already counts at its run's
        # median: step_profile.STALL)
        best = {key: _median_repeat(pairs) for key, pairs in tries.items()}
        plain_out = next(iter(best.values()))[1][1]
        emitted = sum(len(o) for o in plain_out)
        # the most a copy from the context could save these answers at each k (a count)
        ceiling = {k: copy_ceiling(prompts, plain_out, k) for k in ks}
        width = min(b, len(prompts))  # sequences decoding side by side
        # Leviathan's terms at this batch: c and v against one decode step of the b sequences
        reps = max(3, 20 // width)  # best of: a larger batch's forward is long enough to time in fewer
        if module_costs:
            cost_of = costs(model, prompt_tokens, dict.fromkeys(ks), reps, batch=width, draft=dmodel, eagle=edraft,
                            heads=heads, medusa_ks=dict.fromkeys(k for m, k in runs if m == "medusa"))
        for method, k in runs:
            (dt, outs, c, prof), (plain_s, plain_out, plain_c, plain_prof) = best[(method, k)]
            drafts, proposed, accepted = (c["spec_decode_num_drafts"], c["spec_decode_num_draft_tokens"],
                                          c["spec_decode_num_accepted_tokens"])
            length = 1 + accepted / max(drafts, 1)
            alpha = alpha_from_tokens_per_step(length, k)
            # f: the share of a sequence's decode steps that had guesses (prompt lookup finds none on
            # some); the tokens not from a verify with guesses, nor sampled at the prompt, came one a step
            plain_steps = max(c["num_generation_tokens"] - len(prompts) - drafts - accepted, 0)
            f = drafts / max(drafts + plain_steps, 1)
            cost = v = None
            if module_costs:
                cost = 0.0 if method == "ngram" else cost_of[(method, k) if method == "medusa" else method]
                v = cost_of[("verify", k)]
            rows.append({"batch_size": width, "method": method, "num_speculative_tokens": k,
                         "confidence_threshold": confidence_threshold if method != "ngram" else 0.0,
                         "baseline_tokens_per_s": emitted / plain_s,
                         "tokens_per_s": emitted / dt, "speedup": plain_s / dt,
                         "acceptance_rate": accepted / max(proposed, 1), "alpha": alpha,
                         "guesses_per_step": proposed / max(drafts, 1),  # on the steps with guesses
                         "mean_acceptance_length": length, "draft_cost_ratio": cost, "verify_cost_ratio": v,
                         "share_of_steps_with_guesses": f,
                         # Leviathan's formula over the mix of steps with and without guesses
                         "predicted_speedup": mixed_speedup(f, length, k * cost, v) if module_costs else None,
                         "steps": c["num_steps"], "baseline_steps": plain_c["num_steps"],
                         "copy_ceiling": ceiling[k],
                         "outputs_identical": outs == plain_out,
                         # the formula's terms as the engine's own steps measured them, and the
                         # speedup of the decode steps alone (the prompts' prefill is the same either way)
                         "engine": engine_terms(plain_prof, prof, plain_c, c)})
    return rows


GOALS = {"grounded": (2.5, ("ngram", "draft", "eagle", "medusa")), "free": (1.8, ("draft", "eagle"))}


def needed_alpha(goal: float, k: int, c: float, v: float) -> float | None:
    """The per-position acceptance at which Leviathan's formula reaches ``goal`` with this k, c
    and v (None: not even a = 1 does)."""
    if predicted_speedup(1.0 - 1e-12, k, c, v) < goal:
        return None
    lo, hi = 0.0, 1.0 - 1e-12
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted_speedup(mid, k, c, v) < goal else (lo, mid)
    return hi


def goal_verdict(rows: list[dict], prompt_set: str) -> dict | None:
    """The set's goal at batch 1 (best method among those it names): met, or missed with the
    factor that falls short (the acceptance a that would reach it at the measured c and v, and
    the share of the predicted speedup the engine's step delivered), with the row's
    ``copy_ceiling``: what no proposer that copies from the context can beat at its k."""
    if prompt_set not in GOALS:
        return None
    goal, allowed = GOALS[prompt_set]
    cands = [r for r in rows if r["batch_size"] == 1 and r["method"] in allowed]
    if not cands:
        return None
    r = max(cands, key=lambda r: r["speedup"])
    out = {"prompt_set": prompt_set, "goal": goal, "method": r["method"], "num_speculative_tokens": r["num_speculative_tokens"],
           "speedup": r["speedup"], "decode_speedup": r["engine"]["measured_decode_speedup"],
           "predicted_speedup": r["predicted_speedup"], "met": r["speedup"] >= goal,
           "alpha": r["alpha"], "needed_alpha": needed_alpha(goal, r["num_speculative_tokens"], r["draft_cost_ratio"],
                                                            r["verify_cost_ratio"]),
           "delivered_share_of_prediction": r["speedup"] / r["predicted_speedup"],
           "copy_ceiling": r["copy_ceiling"]}
    return out


def _eagle_folder(target: str):
    from inferlab.spec.eagle import eagle_folder_for

    folder = eagle_folder_for(target)
    return folder if (folder / "config.json").exists() else None


def main(argv: list[str]) -> int:
    from inferlab.cli import add_quantization_argument

    p = argparse.ArgumentParser(prog="inferlab bench spec", description=__doc__.splitlines()[0])
    p.add_argument("--target", default="target", help="target model (default: target)")
    p.add_argument("--draft", default=None,
                   help="draft model (default: <target>_draft where `inferlab train draft` made one, else draft)")
    p.add_argument("--k", type=int, nargs="+", default=[2, 4], help="guesses per step to sweep (default: 2 4)")
    p.add_argument("--prompts", type=int, default=None,
                   help="held-out prompts (default: 4 code prompts; all 16 of a chat set)")
    p.add_argument("--new-tokens", type=int, default=None,
                   help="tokens generated per prompt (default: 64; a chat answer stops at its end, at most 128)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats: the contiguous loop keeps the best, the engine's runs the median (default: 3)")
    p.add_argument("--batch-sizes", type=int, nargs="*", default=[1, 4, 16],
                   help="batch sizes of the engine table (default: 1 4 16; none: skip it)")
    p.add_argument("--prompt-set", nargs="+", choices=["code", "grounded", "free"], default=None,
                   help="code: held-out standard-library files (the embedded pair; both tables); grounded, free: "
                        "bench/spec_prompts.json as chat prompts (engine table; default for a chat model: both)")
    p.add_argument("--methods", nargs="+", choices=["ngram", "draft", "medusa", "eagle"], default=None,
                   help="methods of the engine table (default: every one this target has)")
    p.add_argument("--confidence-threshold", type=float, default=0.0,
                   help="draft, medusa, eagle: stop a chain of guesses where the proposer's own estimate that it is "
                        "accepted falls below this (EAGLE-2's confidence; default 0: always k guesses)")
    add_quantization_argument(p, "the target: ")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if min(args.k) < 1 or (args.prompts or 1) < 1 or (args.new_tokens or 1) < 1 or args.repeats < 1 \
            or min(args.batch_sizes or [1]) < 1:
        p.error("--k, --prompts, --new-tokens, --repeats and --batch-sizes must be >= 1")
    if not 0 <= args.confidence_threshold < 1:
        p.error("--confidence-threshold must be in [0, 1) (0: always k guesses)")
    model, tok, _ = load_model(args.target, "cpu", quantization=args.quantization)
    chat = getattr(tok, "chat_template", None) is not None
    sets = args.prompt_set or (["grounded", "free"] if chat else ["code"])
    heads, _ = medusa_heads(args.target, model)
    eagle = _eagle_folder(args.target)
    skipped = {}
    methods = ["ngram", "draft"] + (["medusa"] if heads is not None else []) + (["eagle"] if eagle else [])
    if heads is None:
        skipped["medusa"] = f"no Medusa heads for {args.target} (train them with `inferlab train medusa`)"
    if eagle is None:
        skipped["eagle"] = f"no EAGLE draft for {args.target} (train one with `inferlab train eagle --target {args.target}`)"
    if args.draft is None:
        args.draft = str(beside_target(args.target, "draft"))
        args.draft = args.draft if layer_draft.folder_of(args.draft) else "draft"
    try:  # the draft must fit this target: cut from it, or with its tokenizer
        draft_model(args.draft, model, tok)
    except (ValueError, InferlabError) as exc:
        methods.remove("draft")
        skipped["draft"] = f"{args.draft}: {str(exc).split(':')[0]}"
    if args.methods:
        methods = [m for m in methods if m in args.methods]
    medusa = None if heads is None else (heads_folder_for(args.target), heads.num_heads)
    res = {"target": args.target, "quantization": args.quantization, "threads": torch.get_num_threads(),
           "confidence_threshold": args.confidence_threshold,
           "skipped_methods": skipped, "engine": [], "goals": []}
    for name in sets:
        if name == "code":
            res.update(run(args.target, args.draft, tuple(args.k), args.prompts or 4, 128, args.new_tokens or 64,
                           args.repeats, args.quantization))
            rows = engine_table(model, tok, tuple(args.k), tuple(args.batch_sizes), 128, args.new_tokens or 64,
                                args.repeats, methods=tuple(methods), draft=args.draft, medusa=medusa,
                                eagle=eagle, confidence_threshold=args.confidence_threshold) if args.batch_sizes else []
        else:
            from inferlab.model.chat import Chat

            params = Chat(tok).sampling_params(SamplingParams(temperature=0, max_tokens=args.new_tokens or 128))
            rows = engine_table(model, tok, tuple(args.k), tuple(args.batch_sizes or [1]), 128, args.new_tokens or 128,
                                args.repeats, methods=tuple(methods), draft=args.draft, medusa=medusa, eagle=eagle,
                                prompts=chat_prompts(tok, name, args.prompts), params=params,
                                confidence_threshold=args.confidence_threshold)
        for r in rows:
            r["prompt_set"] = name
        res["engine"] += rows
        verdict = goal_verdict(rows, name)
        if verdict:
            res["goals"].append(verdict)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    if "methods" in res:
        print(f"{res['path']}: plain decoding {res['baseline_tokens_per_s']:.1f} tok/s "
              f"({res['prompts']} held-out prompts x {res['new_tokens']} tokens, {res['threads']} threads)")
        print(f"{'method':8} {'k':>2} {'tok/s':>7} {'speedup':>8} {'predicted':>9} {'a':>5} {'len':>5} {'c':>5} {'v':>5} same"
              "   (a: per-position acceptance, from len)")
    for r in res.get("methods", []):
        print(f"{r['method']:8} {r['num_speculative_tokens']:>2} {r['tokens_per_s']:7.1f} {r['speedup']:7.2f}x "
              f"{r['predicted_speedup']:8.2f}x {r['alpha']:5.2f} {r['mean_acceptance_length']:5.2f} "
              f"{r['draft_cost_ratio']:5.2f} {r['verify_cost_ratio']:5.2f} {r['outputs_identical']}")
    for name in dict.fromkeys(r["prompt_set"] for r in res["engine"]):
        print(f"\nthe engine on the {name} prompts, speculation against the engine without it (greedy; speedup: the "
              "whole run, decode: its decode steps alone; "
              + ("all prompts at once)" if name == "code" else "all prompts, at most batch-size at a time)"))
        print(f"{'batch':>5} {'method':8} {'k':>2} {'plain tok/s':>11} {'spec tok/s':>10} {'speedup':>8} {'decode':>7} {'predicted':>9} "
              f"{'a':>5} {'len':>5} {'c':>5} {'v':>5} {'steps':>11} same")
        for r in (r for r in res["engine"] if r["prompt_set"] == name):
            print(f"{r['batch_size']:>5} {r['method']:8} {r['num_speculative_tokens']:>2} {r['baseline_tokens_per_s']:11.1f} "
                  f"{r['tokens_per_s']:10.1f} {r['speedup']:7.2f}x {r['engine']['measured_decode_speedup']:6.2f}x {r['predicted_speedup']:8.2f}x {r['alpha']:5.2f} "
                  f"{r['mean_acceptance_length']:5.2f} {r['draft_cost_ratio']:5.2f} {r['verify_cost_ratio']:5.2f} "
                  f"{r['steps']:>4} of {r['baseline_steps']:<4} {r['outputs_identical']}")
    steps = [r for r in res["engine"] if "engine" in r]
    if steps:
        print("\nthe step as the engine ran it (ms per decode step; the formula's terms from these steps: "
              "v = verify forward / plain forward, kc = the proposer's work, f = share of steps with guesses; "
              "stalls: steps over 5x the run's median, a core taken mid-step, counted at the median)")
        print(f"{'set':8} {'batch':>5} {'method':8} {'k':>2} {'forward':>8} {'propose':>8} {'rest':>6} {'stalls':>6} {'v':>5} {'kc':>5} "
              f"{'f':>5} {'len':>5} {'predicted':>9} {'measured':>8}")
        for r in steps:
            e = r["engine"]
            for label, per, stalls in (("plain", e["plain_step_s"], e["stalled_steps"]["plain_run"]),
                                       (r["method"], e["spec_step_s"], e["stalled_steps"]["spec_run"])):
                drafting = per["propose"] + per["fill"] + per["observe"]
                rest = sum(per.values()) - per["forward"] - drafting
                terms = (f"{e['verify_cost_ratio']:5.2f} {e['draft_cost_per_step']:5.2f} "
                         f"{e['share_of_steps_with_guesses']:5.2f} {e['mean_acceptance_length']:5.2f} "
                         f"{e['predicted_decode_speedup']:8.2f}x {e['measured_decode_speedup']:7.2f}x"
                         if label != "plain" else "")
                print(f"{r['prompt_set']:8} {r['batch_size']:>5} {label:8} {r['num_speculative_tokens'] if label != 'plain' else '':>2} "
                      f"{per['forward'] * 1e3:8.1f} {drafting * 1e3:8.2f} {rest * 1e3:6.2f} {stalls:>6} {terms}")
    for g in res["goals"]:
        line = (f"goal on {g['prompt_set']}: {g['goal']}x at batch 1 -> {g['method']} k={g['num_speculative_tokens']} "
                f"{g['speedup']:.2f}x ({g['decode_speedup']:.2f}x on the decode steps): {'met' if g['met'] else 'MISSED'}")
        if not g["met"]:
            need = ("no a reaches it at this c and v" if g["needed_alpha"] is None
                    else f"a = {g['alpha']:.2f} where the formula needs {g['needed_alpha']:.2f}")
            line += (f" ({need}; the step delivered {g['delivered_share_of_prediction']:.0%} of the "
                     f"{g['predicted_speedup']:.2f}x the formula predicts from its own a, c and v)")
            if g["method"] == "ngram":
                line += (f"; a lookup that knew every answer would save at most {g['copy_ceiling']:.2f}x the steps "
                         f"at k={g['num_speculative_tokens']}, with verifies that cost one plain step")
        print(line)
    for m, why in res["skipped_methods"].items():
        print(f"skipped {m}: {why}")
    return 0
