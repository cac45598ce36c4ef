"""Graded tests for lab 05. `inferlab grade labs/05_continuous_batching` runs them against starter.py;
with --reference they run against inferlab.engine.policy, the reference solution. The engine tests put
your policy into a real LLMEngine (an embedded model) and check every step through its step hook."""
import pytest
import torch

from inferlab import labkit
from inferlab.engine import BlockManager, EngineConfig, LLMEngine
from inferlab.engine.policy import ContinuousPolicy as ReferencePolicy
from inferlab.engine.request import EngineSequence
from inferlab.engine.scheduler import Scheduler, SchedulerOutput
from inferlab.model.loader import load_checkpoint
from inferlab.sampling import SamplingParams

lab = labkit.implementation(__file__, reference="inferlab.engine.policy",
                            functions=["schedule_running", "ContinuousPolicy"])

GREEDY = dict(temperature=0, ignore_eos=True)


# ---------------------------------------------------------------- schedule_running on its own

def scheduler(num_blocks=16, block_size=4, chunked=False, budget=64, max_num_seqs=8):
    return Scheduler(BlockManager(num_blocks, block_size), max_num_seqs, budget, chunked)


def running(s, n_prompt, computed, n_out=0, seq_id=None):
    """A sequence already running: ``computed`` of its tokens have K/V (and KV slots) already."""
    seq_id = len(s.running) + len(s.waiting) if seq_id is None else seq_id
    seq = EngineSequence(seq_id, list(range(10, 10 + n_prompt)), SamplingParams(max_tokens=50),
                         output_token_ids=[7] * n_out, request_id=f"q{seq_id}")
    s.block_manager.allocate(seq_id, seq.token_ids(0, computed))
    seq.num_computed_tokens = computed
    s.running.append(seq)
    return seq


def scheduled(out):
    return [(x.seq.request_id, x.num_new_tokens) for x in out.scheduled]


@labkit.points(2)
def test_decodes_oldest_first_within_the_budget():
    s = scheduler(budget=2)
    for _ in range(3):
        running(s, 5, 5, n_out=1)               # each has one sampled token to compute: a decode
    out = SchedulerOutput()
    left = lab.schedule_running(s, out, 2)
    labkit.expect(scheduled(out) == [("q0", 1), ("q1", 1)],
                  "a budget of 2 tokens runs the two oldest decodes, one token each", scheduled=scheduled(out))
    labkit.expect(left == 0, "schedule_running returns the budget left over", returned=left)
    labkit.expect(len(s.running) == 3 and not out.preempted, "nothing is preempted when blocks are plentiful")


@labkit.points(2)
def test_a_prefill_chunk_takes_what_the_budget_leaves():
    s = scheduler(chunked=True, budget=10)
    running(s, 5, 5, n_out=1)                    # a decode: 1 token
    running(s, 40, 8)                            # a prompt computed up to 8 of 40 tokens
    running(s, 5, 5, n_out=1)                    # the newest: no budget left for it
    out = SchedulerOutput()
    left = lab.schedule_running(s, out, 10)
    labkit.expect(scheduled(out) == [("q0", 1), ("q1", 9)],
                  "with chunked prefill the prompt gets the 9 tokens the decode left of a 10-token budget",
                  scheduled=scheduled(out))
    labkit.expect(left == 0, "the whole budget is spent", returned=left)
    labkit.expect(s.block_manager.num_tokens(1) == 17, "grow the prompt's KV slots to cover the chunk (8 + 9)",
                  slots=s.block_manager.num_tokens(1))


@labkit.points(3)
def test_preempts_the_newest_when_blocks_run_out():
    s = scheduler(num_blocks=4, block_size=4)
    old = running(s, 8, 8, n_out=1)              # 8 tokens fill 2 blocks; its decode needs a third
    mid = running(s, 3, 3, n_out=1)              # 1 block, room left in it
    new = running(s, 3, 3, n_out=1)              # 1 block: the pool is now full
    out = SchedulerOutput()
    lab.schedule_running(s, out, 64)
    labkit.expect(out.preempted == [new], "the newest running sequence is the one preempted",
                  preempted=[x.request_id for x in out.preempted])
    labkit.expect(scheduled(out) == [("q0", 1), ("q1", 1)], "after the preemption both older decodes run",
                  scheduled=scheduled(out))
    labkit.expect(s.waiting and s.waiting[0] is new and new not in s.running and new.seq_id not in s.block_manager.seq_ids,
                  "a preempted sequence gives back its blocks and waits at the front of the queue")
    labkit.expect(s.block_manager.num_free_blocks == 0 and len(s.block_manager.block_table(old.seq_id)) == 3,
                  "its freed block went to the oldest sequence", free=s.block_manager.num_free_blocks)
    # the sequence being scheduled can be the newest: it preempts itself and the step ends
    s2 = scheduler(num_blocks=3, block_size=4)
    running(s2, 8, 8, n_out=1)
    lone = running(s2, 4, 4, n_out=1)             # its decode needs a 4th block: none is free
    out2 = SchedulerOutput()
    lab.schedule_running(s2, out2, 64)
    labkit.expect(out2.preempted == [lone] and scheduled(out2) == [("q0", 1)],
                  "when the sequence that needs a block is itself the newest, it is preempted and not scheduled",
                  scheduled=scheduled(out2), preempted=[x.request_id for x in out2.preempted])


# ---------------------------------------------------------------- the policy in a real engine

@pytest.fixture(scope="module")
def model():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steps of a 0.95M-parameter model are fastest on one thread (no contention)
    yield load_checkpoint("mha", device="cpu")  # the small embedded model
    torch.set_num_threads(threads)


def run(model, requests, policy=None, **knobs):
    """Run ``requests`` [(prompt ids, max_tokens)] through an engine; your policy unless ``policy``."""
    engine = LLMEngine(*model, EngineConfig(**knobs))
    engine.scheduler.policy = policy or lab.ContinuousPolicy()
    records, tables = [], []
    engine.step_hooks.append(lambda e, rec: (records.append(rec), tables.append(set(e.block_manager.seq_ids))))
    for i, (prompt, n) in enumerate(requests):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=n, **GREEDY))
    tokens = {}
    for _ in range(2000):
        if not engine.has_unfinished_requests():
            break
        try:
            outputs = engine.step()
        except KeyError as exc:  # the block manager knows no such sequence: say why, not just "KeyError: 5"
            where = labkit.explain(exc).partition("\n")[2].strip()
            raise labkit.LabError(
                f"step {len(records)}: the KV pool holds no blocks for sequence {exc} (KeyError: {exc}). It was "
                "preempted earlier in this step, then grown or scheduled again. A preempted sequence is in "
                "out.preempted (the sequences preempted so far this step) and no longer in s.running: stop "
                "scheduling it, and admit nobody once out.preempted is not empty." + (f"\n  {where}" if where else "")
            ) from None
        for o in outputs:
            if o.finished:
                tokens[o.request_id] = o.outputs[0].token_ids
    return {"records": records, "tables": tables, "tokens": tokens, "engine": engine}


def prompts(lengths, seed=0):
    return [[(seed * 131 + i * 17 + j * 7) % 3000 + 20 for j in range(n)] for i, n in enumerate(lengths)]


MIXED = list(zip(prompts([12, 40, 5, 70, 9, 22, 30, 6, 15, 3]), [9, 3, 14, 4, 20, 6, 2, 11, 5, 8]))


@labkit.points(2)
def test_budget_and_sequence_cap_hold_at_every_step(model):
    r = run(model, MIXED, max_num_seqs=3, enable_chunked_prefill=True, max_num_batched_tokens=16)
    for rec in r["records"]:
        labkit.expect(rec["num_batched_tokens"] <= 16, "a step computed more tokens than max_num_batched_tokens",
                      step=rec["step"], tokens=rec["num_batched_tokens"])
        labkit.expect(len(rec["scheduled"]) <= 3, "a step ran more sequences than max_num_seqs",
                      step=rec["step"], sequences=len(rec["scheduled"]))
    labkit.expect(len(r["tokens"]) == len(MIXED), "every request must finish", finished=sorted(r["tokens"]))


@labkit.points(2)
def test_admission_is_first_come_first_served(model):
    # without chunking a 50-token prompt needs most of a 64-token budget: small ones must not jump it
    reqs = list(zip(prompts([50, 4, 50, 4, 50, 4, 6]), [3, 3, 3, 3, 3, 3, 3]))
    r = run(model, reqs, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    first = {}
    for rec in r["records"]:
        for row in rec["scheduled"]:
            first.setdefault(row["request_id"], rec["step"])
    order = [first.get(f"r{i}") for i in range(len(reqs))]
    labkit.expect(None not in order and order == sorted(order),
                  "requests must start in the order they arrived (step each one first ran)", first_step=order)


@labkit.points(2)
def test_a_freed_slot_is_refilled_at_the_next_step(model):
    reqs = MIXED[:8]
    r = run(model, reqs, max_num_seqs=3)
    done = 0
    for rec in r["records"]:
        want = min(3, len(reqs) - done)
        labkit.expect(len(rec["scheduled"]) == want,
                      "with blocks and budget to spare, every step runs min(max_num_seqs, unfinished requests)",
                      step=rec["step"], ran=len(rec["scheduled"]), unfinished=len(reqs) - done)
        done += len(rec["finished"])
    static = run(model, reqs, policy=_static(), max_num_seqs=3)
    labkit.expect(len(r["records"]) < len(static["records"]), "continuous batching needs fewer steps than static",
                  continuous=len(r["records"]), static=len(static["records"]))


def _static():
    from inferlab.engine.policy import StaticPolicy

    return StaticPolicy()


@labkit.points(3)
def test_no_starvation_and_the_same_tokens_as_the_reference(model):
    knobs = dict(max_num_seqs=4, enable_chunked_prefill=True, max_num_batched_tokens=16, num_kv_blocks=14, block_size=8)
    reqs = MIXED + list(zip(prompts([100, 7, 11], seed=5), [6, 12, 4]))
    mine = run(model, reqs, **knobs)
    ref = run(model, reqs, policy=ReferencePolicy(), **knobs)
    missing = sorted(set(ref["tokens"]) - set(mine["tokens"]))
    labkit.expect(not missing, "every request must finish (a small pool and a small budget starve none)",
                  unfinished=missing, steps=len(mine["records"]))
    for rid, want in ref["tokens"].items():
        labkit.expect(mine["tokens"][rid] == want, f"request {rid}: greedy tokens differ from the reference policy's",
                      got=mine["tokens"][rid], expected=want)


@labkit.points(3)
def test_preemption_happens_and_frees_blocks(model):
    reqs = list(zip(prompts([9, 7, 12, 6, 10, 8]), [30, 28, 26, 24, 30, 20]))
    r = run(model, reqs, max_num_seqs=6, num_kv_blocks=10, block_size=8)
    pre = [(i, rid) for i, rec in enumerate(r["records"]) for rid in rec["preempted"]]
    labkit.expect(len(pre) > 0, "a 10-block pool cannot hold six growing sequences: something must be preempted")
    seq_id = {row["request_id"]: row["seq_id"] for rec in r["records"] for row in rec["scheduled"]}
    for i, rid in pre:
        rows = r["records"][i]["scheduled"]
        labkit.expect(all(row["request_id"] != rid for row in rows),
                      "a sequence preempted in a step must not also run in it", step=i, request=rid)
        labkit.expect(seq_id[rid] not in r["tables"][i], "a preempted sequence must give back its KV blocks",
                      step=i, request=rid)
        admitted = [row["request_id"] for row in rows if row["kind"] != "decode"]
        labkit.expect(not admitted, "after a preemption the pool is short: admit nobody in that step",
                      step=i, admitted=admitted)
    labkit.expect(len(r["tokens"]) == len(reqs) and all(len(r["tokens"][f"r{i}"]) == n for i, (_, n) in enumerate(reqs)),
                  "every preempted request comes back and finishes with all its tokens")
    used = r["engine"].kv_cache_stats()["used_blocks"]
    labkit.expect(used == 0, "every block is back in the pool at the end", used_blocks=used)
