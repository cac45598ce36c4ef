"""A hypothesis state machine drives the engine: requests arrive (many share a system prompt), are
aborted, steps run or fail, under a tiny pool with chunked prefill and prefix caching. After every
rule the KV books balance, and every request that finishes has the tokens of a solo greedy run of
the contiguous reference."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from inferlab.generate import generate
from inferlab.sampling import SamplingParams

from .conftest import make_engine, same_greedy

SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18]  # two blocks of 4: prefix hits happen
PROMPTS = st.builds(lambda k, rest: (SYSTEM[:k] + rest) or [3], st.sampled_from([0, 4, 8, 8]),
                    st.lists(st.integers(3, 40), min_size=0, max_size=10))


@pytest.fixture(scope="module")
def machine(tiny):
    solo_cache: dict = {}
    seen = {"preemptions": 0, "finished": 0}

    class EngineMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.engine = make_engine(tiny, block_size=4, num_kv_blocks=6, max_num_seqs=4,
                                      max_num_batched_tokens=8, enable_chunked_prefill=True,
                                      enable_prefix_caching=True)
            self.live: dict[str, tuple] = {}
            self.count = 0

        @rule(prompt=PROMPTS, max_tokens=st.integers(1, 6), n=st.integers(1, 2))
        def add(self, prompt, max_tokens, n):
            rid = str(self.count)
            self.count += 1
            self.engine.add_request(rid, prompt, SamplingParams(temperature=0, max_tokens=max_tokens, n=n,
                                                                ignore_eos=True))
            self.live[rid] = (tuple(prompt), max_tokens)

        @precondition(lambda self: self.live)
        @rule(data=st.data())
        def abort(self, data):
            rid = data.draw(st.sampled_from(sorted(self.live)))
            self.engine.abort_request(rid)
            del self.live[rid]

        @precondition(lambda self: self.engine.has_unfinished_requests())
        @rule()
        def step(self):
            for out in self.engine.step():
                if out.finished:
                    prompt, max_tokens = self.live.pop(out.request_id)
                    key = (prompt, max_tokens)
                    if key not in solo_cache:
                        sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
                        solo_cache[key] = generate(tiny[0], [list(prompt)], [sp])[0].output_token_ids
                    assert all(same_greedy(tiny[0], prompt, c.token_ids, solo_cache[key]) for c in out.outputs)
                    seen["finished"] += 1
            seen["preemptions"] = max(seen["preemptions"], self.engine.num_preemptions)

        @precondition(lambda self: self.engine.has_unfinished_requests())
        @rule()
        def failed_step(self):
            """The forward raises (out of memory, say): as the server does, every request in flight
            is aborted. Whatever the step had reserved must not be found by a later prefix hit."""
            model = self.engine.runner.model

            def broken(*args, **kwargs):
                raise RuntimeError("injected failure")

            self.engine.runner.model = broken
            try:
                with pytest.raises(RuntimeError, match="injected failure"):
                    self.engine.step()
            finally:
                self.engine.runner.model = model
            for rid in list(self.live):
                self.engine.abort_request(rid)
            self.live.clear()

        @invariant()
        def books_balance(self):
            bm, sched = self.engine.block_manager, self.engine.scheduler
            stats = bm.stats()
            assert stats["free_blocks"] + stats["used_blocks"] == stats["total_blocks"]
            holders = {s.seq_id for s in sched.running}
            assert set(bm.seq_ids) == holders  # only running sequences hold blocks
            for s in sched.running:
                assert bm.num_tokens(s.seq_id) >= s.num_computed_tokens
            if not self.engine.has_unfinished_requests():
                assert stats["used_blocks"] == 0

    EngineMachine.seen = seen
    return EngineMachine


def test_engine_state_machine(machine):
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(machine, settings=settings(max_examples=25, stateful_step_count=40, deadline=None, derandomize=True,
                                                         suppress_health_check=list(HealthCheck)))
    assert machine.seen["preemptions"] > 0 and machine.seen["finished"] > 0  # the pool was tight enough
