"""``inferlab bench kv``: how much KV-cache memory a contiguous and a paged cache waste.

A seeded serving workload (mixed prompt and output lengths, some requests opening with one of a few
shared system prompts) is run through the engine's own :class:`Scheduler` and :class:`BlockManager`
(admission, token budget, preemption, prefix caching: the code ``LLMEngine`` runs), with a model
runner that computes nothing: each step "writes" the K/V it was scheduled to and each sequence
that reached its last token "samples" the next one from a fixed script. So the waste reported is
the engine's, not that of a model of it. At every step we count

* ``used``: token slots holding K/V a running sequence needs (its prompt + tokens so far);
* ``contiguous reserved``: ``max_model_len`` slots per running sequence, as a static cache that
  must fit the longest possible answer reserves them (HF ``StaticCache``, FasterTransformer, Orca);
* ``paged reserved``: ``block_size`` slots per block in use (PagedAttention, Kwon et al. SOSP'23).

Waste is ``1 - used / reserved`` summed over steps (token-steps: memory held x time held). The
paged run has prefix caching off, so its waste is only the partly filled last block of each
sequence. A second run with prefix caching on reports how much the shared system prompts save.
"""
from __future__ import annotations

import argparse

from inferlab.cli import HelpFormatter
import json
import random
from dataclasses import dataclass

from inferlab.engine.block_manager import BlockManager
from inferlab.engine.request import EngineSequence
from inferlab.engine.scheduler import Scheduler
from inferlab.sampling import SamplingParams

HOW_COUNTED = ("token-steps: at every engine step, used = prompt + generated tokens of each running "
               "sequence; contiguous reserved = max_model_len per running sequence; paged reserved = "
               "block_size x blocks in use (prefix caching off); waste = 1 - sum(used) / sum(reserved) "
               "over all steps. prefix_hit_rate and shared_blocks come from a second replay with prefix "
               "caching on (hit rate in full blocks looked up; shared_blocks = peak blocks held by >1 sequence).")


@dataclass
class Request:
    arrival: int              # the engine step it arrives at
    prompt: list[int]
    output: list[int]         # the tokens it will generate (fixed, so replays are comparable)


def make_workload(num_requests: int = 200, max_model_len: int = 2048, seed: int = 0,
                  vocab_size: int = 4096, shared_fraction: float = 0.5) -> list[Request]:
    """Seeded requests: Poisson-ish arrivals, chat-like lengths, some with a shared system prompt."""
    rng = random.Random(seed)
    systems = [[rng.randrange(vocab_size) for _ in range(n)] for n in (96, 200, 320)]
    requests, step = [], 0
    for _ in range(num_requests):
        step += int(rng.expovariate(1 / 4))
        system = rng.choice(systems) if rng.random() < shared_fraction else []
        user = [rng.randrange(vocab_size) for _ in range(rng.randint(16, 600))]
        prompt = (system + user)[: max_model_len - 16]
        kind = rng.random()     # short answers, medium ones, long ones
        n_out = rng.randint(16, 64) if kind < 0.3 else rng.randint(64, 256) if kind < 0.8 else rng.randint(256, 900)
        n_out = min(n_out, max_model_len - len(prompt))
        requests.append(Request(step, prompt, [rng.randrange(vocab_size) for _ in range(n_out)]))
    return requests


def replay(requests: list[Request], block_size: int = 16, num_blocks: int | None = None,
           max_num_seqs: int = 32, max_model_len: int = 2048, enable_prefix_caching: bool = False,
           on_step=None) -> dict:
    """Run the workload through the engine's Scheduler with a runner that computes nothing; return
    token-step totals.

    The scheduler has the engine's default knobs (continuous policy, no chunked prefill, a token
    budget of ``max(max_model_len, 2048)``). ``on_step(step, manager, running)`` is called after
    every step with {seq id (the request's index): tokens generated} (the allocator view records
    snapshots with it).
    """
    if num_blocks is None:      # the memory a contiguous cache needs for the same batch
        num_blocks = max_num_seqs * max_model_len // block_size
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching)
    sched = Scheduler(bm, max_num_seqs, max(max_model_len, 2048))
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
    totals = {"used": 0, "contiguous": 0, "paged": 0, "peak_shared": 0, "steps": 0,
              "prompt_tokens": 0, "cached_tokens": 0}
    step = 0
    while order or sched.has_unfinished():
        while order and requests[order[0]].arrival <= step:
            i = order.pop(0)
            r = requests[i]
            sched.add(EngineSequence(i, list(r.prompt), SamplingParams(max_tokens=max(1, len(r.output)))))
        before = {s.seq_id for s in sched.running}
        out = sched.schedule()
        if not out.scheduled and sched.waiting and not sched.running:
            seq = sched.waiting[0]
            raise ValueError(f"request {seq.seq_id} ({seq.num_tokens} tokens) does not fit in {num_blocks} "
                             f"blocks of {block_size}; give more blocks")
        for s in out.scheduled:
            if s.seq.seq_id not in before:               # admitted now: prefix hits are not computed
                totals["prompt_tokens"] += s.seq.num_tokens
                totals["cached_tokens"] += s.seq.num_computed_tokens
        sched.update_from_output(out)                    # the runner "wrote" the scheduled K/V
        for s in out.scheduled:
            seq = s.seq
            if seq.num_computed_tokens == seq.num_tokens:  # its next token is "sampled"
                script = requests[seq.seq_id].output
                seq.output_token_ids.append(script[len(seq.output_token_ids)] if script else 0)
                if len(seq.output_token_ids) >= len(script):
                    sched.finish(seq)
        running = sched.running
        if running:
            totals["used"] += sum(bm.num_tokens(s.seq_id) for s in running)
            totals["contiguous"] += max_model_len * len(running)
            totals["paged"] += block_size * (bm.num_blocks - bm.num_free_blocks)
            held = {b for s in running for b in bm.block_table(s.seq_id)}
            totals["peak_shared"] = max(totals["peak_shared"], sum(bm.ref_count(b) > 1 for b in held))
            totals["steps"] += 1
        if on_step is not None:
            on_step(step, bm, {s.seq_id: len(s.output_token_ids) for s in running})
        step += 1
    totals["preemptions"] = sched.num_preemptions
    totals["stats"] = bm.stats()
    return totals


def run(num_requests: int = 200, block_size: int = 16, max_model_len: int = 2048, max_num_seqs: int = 32,
        seed: int = 0) -> dict:
    if block_size < 1 or max_model_len < 2 or num_requests < 1 or max_num_seqs < 1:
        raise ValueError("--block-size, --max-model-len, --num-requests and --max-num-seqs must be positive")
    requests = make_workload(num_requests, max_model_len, seed)
    plain = replay(requests, block_size, max_num_seqs=max_num_seqs, max_model_len=max_model_len)
    cached = replay(requests, block_size, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                    enable_prefix_caching=True)
    return {
        "num_requests": num_requests, "block_size": block_size, "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs, "seed": seed, "steps": plain["steps"],
        "used_tokens": plain["used"],
        "contiguous_reserved_tokens": plain["contiguous"],
        "paged_reserved_tokens": plain["paged"],
        "contiguous_waste": 1 - plain["used"] / plain["contiguous"],
        "paged_waste": 1 - plain["used"] / plain["paged"],
        "prefix_cached_reserved_tokens": cached["paged"],
        "prefix_saving": 1 - cached["paged"] / plain["paged"],
        "prefill_tokens_saved": cached["cached_tokens"] / cached["prompt_tokens"],
        "prefix_hit_rate": cached["stats"]["prefix_hit_rate"],
        "shared_blocks": cached["peak_shared"], "preemptions": plain["preemptions"],
        "how_counted": HOW_COUNTED,
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="inferlab bench kv", description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--num-requests", type=int, default=200, help="requests in the replayed workload")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--max-model-len", type=int, default=2048, help="slots a contiguous cache reserves per sequence")
    p.add_argument("--max-num-seqs", type=int, default=32, help="sequences running at once")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload's prompt and output lengths")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    r = run(a.num_requests, a.block_size, a.max_model_len, a.max_num_seqs, a.seed)
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{r['num_requests']} requests, block_size {r['block_size']}, max_model_len {r['max_model_len']}, "
          f"up to {r['max_num_seqs']} running, {r['steps']} steps\n")
    print(f"{'cache':<26}{'reserved token-steps':>22}{'used':>16}{'waste':>9}")
    for name, key in (("contiguous (max length)", "contiguous"), ("paged", "paged")):
        print(f"{name:<26}{r[key + '_reserved_tokens']:>22,}{r['used_tokens']:>16,}{r[key + '_waste']:>9.1%}")
    print(f"{'paged + prefix caching':<26}{r['prefix_cached_reserved_tokens']:>22,}"
          f"   ({r['prefix_saving']:.1%} less memory than paged alone)")
    print(f"\nprefix hit rate {r['prefix_hit_rate']:.1%} of full prompt blocks, {r['prefill_tokens_saved']:.1%} "
          f"of prompt tokens not recomputed, peak {r['shared_blocks']} shared blocks")
    print(f"\nhow counted: {r['how_counted']}")
    return 0
