"""``LLMEngine``: requests in, one scheduler step at a time, outputs out (vLLM's LLMEngine).

    add_request(id, prompt, params) -> waiting queue
    step():  [speculative] each decoding sequence gets guesses (spec_token_ids) from the proposer
             scheduler picks sequences and token counts  (scheduler.py, policy.py)
             model runner runs one ragged forward          (model_runner.py, attention/paged.py)
             sampler draws a token for every sequence whose tokens are all computed; with
             guesses, the verifier keeps a prefix of them and adds one (spec/rejection.py)
             rejected guesses are rolled back, finished sequences free their KV blocks
             [logprobs] requests that asked get their tokens' log-probs (inferlab/logprobs.py)
             -> the RequestOutputs of this step (with text deltas, for streaming)

``LLM.generate``, the CLI and the benchmarks all run on this loop; ``inferlab.generate`` keeps the
contiguous-cache path as the simple reference it is compared with.
"""
from __future__ import annotations

import contextlib
import itertools
import numbers
import time

import torch

from inferlab.cache.paged import PagedKVCache
from inferlab.model.context import fit_max_tokens
from inferlab.engine.block_manager import BlockManager
from inferlab.engine.config import EngineConfig
from inferlab.engine import cpu_share
from inferlab import loop_settings
from inferlab.engine.model_runner import ModelRunner, SeqInput, query_start_loc
from inferlab.engine.request import EngineSequence, Request, RequestMetrics
from inferlab.engine.scheduler import Scheduler
from inferlab.outputs import CompletionOutput, RequestOutput
from inferlab.engine.spec_decode import make_proposer, verify
from inferlab.logprobs import log_probs, token_logprobs
from inferlab.sampling import RequestOutputKind, SamplingParams, make_generator, sample
from inferlab.structured import StructuredOutputs


class LLMEngine:
    def __init__(self, model, tokenizer=None, config: EngineConfig | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.config = (config or EngineConfig()).resolve(model.config, model.dtype, model.device)
        c = self.config
        self.block_manager = BlockManager(c.num_kv_blocks, c.block_size, c.enable_prefix_caching)
        self.kv_cache = PagedKVCache.for_model(model.config, c.num_kv_blocks, c.block_size, model.dtype, model.device,
                                               num_kv_heads=model.model.layers[0].self_attn.n_kv)  # a TP rank's share
        self.scheduler = Scheduler(self.block_manager, c.max_num_seqs, c.max_num_batched_tokens,
                                   c.enable_chunked_prefill, c.batching_policy, c.scheduling_policy)
        # speculative decoding's proposer (engine/proposer.py): prompt lookup, a draft model, Medusa or EAGLE
        self.proposer = make_proposer(c, model, tokenizer)
        self.needs_hidden = self.proposer is not None and self.proposer.needs_hidden
        # hidden states are read through a hook, which a compiled forward would not run
        self.runner = ModelRunner(model, self.kv_cache, compile_decode=not c.enforce_eager and not self.needs_hidden)
        self.on_cpu = model.device.type == "cpu"  # each step then runs on the cores other programs leave free
        self.rejection_sampler = None  # None: inferlab.spec.rejection's; lab 04 plugs a student's in
        self.eos_token_ids = tuple(model.config.eos_token_ids)
        # grammars of constrained requests: compiled when added, a bitmask on the logits before sampling
        self.structured = StructuredOutputs(tokenizer, model.config.vocab_size, self.eos_token_ids)
        self.requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()
        self.counters = {"num_steps": 0, "num_prompt_tokens": 0, "num_generation_tokens": 0,
                         "num_finished_requests": 0, "prefill_s": 0.0, "decode_s": 0.0,
                         "prefill_tokens": 0, "decode_tokens": 0,
                         # vLLM's spec-decode counters: verify steps with guesses, guesses, guesses kept
                         "spec_decode_num_drafts": 0, "spec_decode_num_draft_tokens": 0,
                         "spec_decode_num_accepted_tokens": 0}
        self.step_hooks: list = []  # optional observers: hook(engine, record) after each step (step_record)

    # ---- requests -----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], sampling_params: SamplingParams | None = None,
                    arrival_time: float | None = None, stream: bool = True, priority: int = 0) -> None:
        """Queue a request. ``stream=False`` or ``output_kind=FINAL_ONLY`` in its params: ``step``
        reports it once, finished; otherwise every step that gives it tokens reports it, whole
        (CUMULATIVE) or as what is new (DELTA). ``priority`` (vLLM's): lower is served first;
        needs ``scheduling_policy="priority"``."""
        params = sampling_params or SamplingParams()
        request_id = str(request_id)
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use: give each request its own id")
        if not isinstance(priority, numbers.Integral) or isinstance(priority, bool):
            raise ValueError(f"priority must be an integer (lower is served first), got {priority!r}")
        priority = int(priority)
        if priority != 0 and self.config.scheduling_policy != "priority":
            raise ValueError(f"got priority {priority} but this engine schedules first come, first served: "
                             f"create it with scheduling_policy='priority'")
        text = prompt if isinstance(prompt, str) else None
        if text is not None:
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer.json: pass the prompt as a list of token ids")
            ids = self.tokenizer.encode(text)
        else:
            ids = [int(t) for t in prompt]
        c = self.config
        if not ids:
            raise ValueError("empty prompt: give at least one token")
        fits = fit_max_tokens(params.max_tokens, len(ids), c.max_model_len, context_name="max_model_len")
        for name in ("logprobs", "prompt_logprobs"):
            if (getattr(params, name) or 0) > c.max_logprobs:
                raise ValueError(f"{name}={getattr(params, name)} exceeds max_logprobs={c.max_logprobs}: ask for "
                                 f"at most {c.max_logprobs} top tokens (or raise the engine's max_logprobs)")
        if params.n > c.max_num_seqs:
            raise ValueError(f"n={params.n} exceeds max_num_seqs={c.max_num_seqs}: raise max_num_seqs or lower n")
        if params.max_tokens != fits:  # as the contiguous path does: stop at the context's end
            params = SamplingParams(**{**params.__dict__, "max_tokens": fits})
        pool = c.num_kv_blocks * c.block_size
        if len(ids) + params.max_tokens > pool:
            raise ValueError(f"prompt ({len(ids)}) + max_tokens ({params.max_tokens}) tokens exceed the whole KV "
                             f"pool of {pool} slots (num_kv_blocks x block_size): raise num_kv_blocks or lower max_tokens")
        self.structured.check(params)  # a grammar that cannot compile fails here, not in a step
        metrics = RequestMetrics(time.monotonic() if arrival_time is None else arrival_time)
        stream = stream and params.output_kind != RequestOutputKind.FINAL_ONLY
        req = Request(request_id, text, ids, params, [], metrics, stream=stream,
                      prompt_logprobs=None if params.prompt_logprobs is None else [None])
        seq = self._new_seq(req, 0, priority)
        seq.num_pending_forks = params.n - 1
        req.seqs.append(seq)
        self.requests[request_id] = req
        self.scheduler.add(seq)

    def _new_seq(self, req: Request, index: int, priority: int) -> EngineSequence:
        params = req.params
        seed = None if params.seed is None else params.seed + index  # vLLM: child i uses seed + i
        return EngineSequence(next(self._seq_ids), req.prompt_token_ids, params, request_id=req.request_id,
                              index=index, generator=make_generator(seed, self.model.device),
                              priority=priority, metrics=req.metrics,
                              logprobs=None if params.logprobs is None else [],
                              prompt_logprobs=req.prompt_logprobs)

    def abort_request(self, request_id: str) -> None:
        """Stop a request now: its sequences leave the queues and free their KV blocks."""
        req = self.requests.pop(str(request_id), None)
        if req is None:
            return
        req.aborted = True
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq)
                seq._finish("abort")

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- one step -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        with loop_settings.held():  # the loop settings, read once a step: a proposer's passes ask at every linear too
            return self._step()

    def _step(self) -> list[RequestOutput]:
        if self.on_cpu:
            cpu_share.adjust()
        if self.proposer is not None:
            self.proposer.propose(self.scheduler.running, self.config.speculative_config.num_speculative_tokens)
        out = self.scheduler.schedule()
        if not out.scheduled:
            if self.scheduler.running or self.scheduler.waiting:
                raise RuntimeError("the scheduler could not schedule anything: the KV pool or the token "
                                   "budget is too small for the waiting requests")
            return []
        t0 = time.perf_counter()
        now = time.monotonic()
        draft_probs = self.proposer.fill(out, self.block_manager) if self.proposer is not None else {}
        inputs = []
        for s in out.scheduled:
            seq, c = s.seq, s.seq.num_computed_tokens
            inputs.append(SeqInput(seq.token_ids(c, c + s.num_new_tokens), c,  # guesses included
                                   self.block_manager.block_table(seq.seq_id)))
            m = self.requests[seq.request_id].metrics
            if m.first_scheduled_time is None:
                m.first_scheduled_time = now
        record = self.step_record(out) if self.step_hooks else None  # positions as scheduled
        is_decode = [s.is_decode for s in out.scheduled]
        num_prefill = sum(s.num_new_tokens for s, d in zip(out.scheduled, is_decode) if not d)
        num_logits = [1 + s.num_spec_tokens for s in out.scheduled]
        prompt_rows = self._prompt_rows(out)  # None unless a request wants prompt log-probs from this step
        with self.proposer.capture(self.model) if self.needs_hidden else contextlib.nullcontext() as hidden:
            logits = self.runner.execute(inputs, out.copies, num_logits=num_logits,  # [sum(num_logits), V]
                                         extra_rows=prompt_rows)
        starts = query_start_loc(num_logits)  # sequence j's rows: starts[j]:starts[j + 1]
        if prompt_rows is not None:  # the prompt rows come after the sampling rows
            self._score_prompts(out, prompt_rows, logits[starts[-1]:])
            logits = logits[:starts[-1]]
        ready = [j for j, s in enumerate(out.scheduled)  # its own tokens all computed: sample the next
                 if s.seq.num_computed_tokens + s.num_committed == s.seq.num_tokens]
        self.structured.apply(out, ready, logits, starts)  # constrained rows: forbidden tokens to -inf
        emitted = verify(out, ready, logits, starts, draft_probs, self.counters, self.rejection_sampler)
        scored = self._sample_logprobs(out, ready, emitted, logits, starts)  # {} unless a request asked
        # K/V written: computed counts advance over kept tokens, rejected guesses roll back, full blocks named
        self.scheduler.update_from_output(out, [len(emitted[j]) - 1 if j in emitted else 0
                                                for j in range(len(out.scheduled))])
        touched, decoded = {}, 0
        now = time.monotonic()
        for j in ready:
            seq = out.scheduled[j].seq
            if seq.num_pending_forks:
                self._fork(seq, logits[starts[j]], now, touched)
            for i, tok in enumerate(emitted[j]):  # one by one: stop partway exactly where plain decoding would
                self._append(seq, tok, now, touched, scored[j][i] if j in scored else None)
                decoded += is_decode[j]
                if seq.is_finished:
                    break
        if self.proposer is not None:  # what was kept (Medusa, EAGLE: from this forward's hidden states)
            self.proposer.observe(out, ready, emitted, hidden[-1][0] if self.needs_hidden else None, starts,
                                  self.scheduler.running)
        self._account(num_prefill, decoded, time.perf_counter() - t0)
        if record is not None:
            record.update(seconds=time.perf_counter() - t0, finished=[r for r, q in touched.items() if q.finished])
            for hook in self.step_hooks:
                hook(self, record)
        return [self._output(req) for req in touched.values() if req.stream or req.finished]

    def step_record(self, out) -> dict:
        """Plain data about the step being run, for traces and plots: each scheduled sequence's
        request, first position and token count (its speculative guesses among them), and whether
        it is a (chunk of a) prefill or a decode."""
        rows = []
        for s in out.scheduled:
            seq, start, k = s.seq, s.seq.num_computed_tokens, s.num_new_tokens
            decode = s.is_decode
            rows.append({"request_id": seq.request_id, "seq_id": seq.seq_id, "start": start, "num_new_tokens": k,
                         "num_spec_tokens": s.num_spec_tokens,
                         "num_tokens": seq.num_tokens, "kind": "decode" if decode else "prefill",
                         "chunk": not decode and (start > 0 or start + k < seq.num_tokens)})
        return {"step": self.counters["num_steps"], "scheduled": rows, "num_batched_tokens": out.num_batched_tokens,
                "preempted": [seq.request_id for seq in out.preempted], "num_waiting": self.num_waiting}

    def _append(self, seq: EngineSequence, token: int, now: float, touched: dict, logprob: dict | None = None) -> None:
        if logprob is not None:
            seq.logprobs.append(logprob)
            seq.cumulative_logprob += logprob[token].logprob
        seq.append_token(token, self.eos_token_ids, self.tokenizer)
        if seq.params.structured_outputs is not None and self.structured.accept(seq, token) and not seq.is_finished:
            seq._finish("stop")  # the grammar is complete and allows nothing more
        req = self.requests[seq.request_id]
        m = req.metrics
        if m.first_token_time is None:
            m.first_token_time = now
        m.last_token_time = now
        self.counters["num_generation_tokens"] += 1
        if seq.is_finished:
            self.scheduler.finish(seq)
            if req.finished:
                m.finished_time = now
                self.counters["num_finished_requests"] += 1
        touched[req.request_id] = req

    def _fork(self, parent: EngineSequence, logits: torch.Tensor, now: float, touched: dict) -> None:
        """Parallel sampling: the n - 1 siblings share the prompt's blocks and draw their own first token."""
        req = self.requests[parent.request_id]
        for _ in range(parent.num_pending_forks):
            child = self._new_seq(req, len(req.seqs), parent.priority)
            child.num_computed_tokens = parent.num_computed_tokens
            req.seqs.append(child)
            self.scheduler.fork(parent, child)
            tok = sample(logits[None], [child.params], [child.generator]).item()
            scored = None
            if child.logprobs is not None:
                lp = log_probs(logits[None], [child.params], self.config.logprobs_mode)
                scored = token_logprobs(lp, [tok], [child.params.logprobs], self.tokenizer)[0]
            self._append(child, tok, now, touched, scored)
        parent.num_pending_forks = 0

    # ---- log-probs (only for the requests that ask; inferlab/logprobs.py) -------------------------
    def _prompt_rows(self, out) -> list[tuple[int, int] | None] | None:
        """For each scheduled sequence whose request wants prompt log-probs still missing, the
        span (lo, hi) of its new tokens whose logits score the next prompt token: position t
        predicts token t + 1, so a chunk [c, c + q) scores tokens up to min(c + q, P - 1), from
        the first one not scored yet (a recompute after preemption scores nothing twice).
        None when no sequence asks: the step then runs the head on its sampling rows only."""
        spans = []
        for s in out.scheduled:
            seq, span = s.seq, None
            if seq.needs_prompt_logits:
                c, p = seq.num_computed_tokens, len(seq.prompt_token_ids)
                lo, hi = max(c, len(seq.prompt_logprobs) - 1), min(c + s.num_committed, p - 1)
                span = (lo - c, hi - c) if hi > lo else None
            spans.append(span)
        return spans if any(spans) else None

    def _score_prompts(self, out, spans, rows: torch.Tensor) -> None:
        """Append the prompt log-probs of ``rows`` (the prompt rows, sequence after sequence, in
        ``spans``' order) to each request's ``prompt_logprobs``. Always raw, as in vLLM."""
        lp, r = log_probs(rows), 0
        for s, span in zip(out.scheduled, spans):
            if span is None:
                continue
            seq, k = s.seq, span[1] - span[0]
            first = seq.num_computed_tokens + span[0] + 1  # the first prompt token these rows score
            targets = seq.prompt_token_ids[first:first + k]
            seq.prompt_logprobs += token_logprobs(lp[r:r + k], targets, [seq.params.prompt_logprobs] * k,
                                                  self.tokenizer)
            r += k

    def _sample_logprobs(self, out, ready, emitted, logits, starts) -> dict[int, list[dict]]:
        """{scheduled index: one {token_id: Logprob} per emitted token} for the ready sequences
        that asked. Emitted token i of sequence j was drawn at row starts[j] + i: under
        speculation, the target's row that verified it (never the draft's q)."""
        want = [j for j in ready if out.scheduled[j].seq.logprobs is not None]
        if not want:
            return {}
        rows, tokens, params = [], [], []
        for j in want:
            rows += range(starts[j], starts[j] + len(emitted[j]))
            tokens += emitted[j]
            params += [out.scheduled[j].seq.params] * len(emitted[j])
        lp = log_probs(logits[rows], params, self.config.logprobs_mode)
        entries = iter(token_logprobs(lp, tokens, [p.logprobs for p in params], self.tokenizer))
        return {j: [next(entries) for _ in emitted[j]] for j in want}

    def _account(self, prefill: int, decodes: int, seconds: float) -> None:
        """A step with any prefill token (a 1-token prompt's included) counts as prefill time;
        a step of decodes only (each computes the token sampled last) as decode time, and
        ``decodes`` counts the tokens they emitted (more than one each when guesses are kept)."""
        c = self.counters
        c["num_steps"] += 1
        c["num_prompt_tokens"] += prefill
        if prefill:
            c["prefill_s"] += seconds
            c["prefill_tokens"] += prefill
        else:
            c["decode_s"] += seconds
            c["decode_tokens"] += decodes

    # ---- outputs and statistics ---------------------------------------------------------------
    def _output(self, req: Request) -> RequestOutput:
        # DELTA: the prompt's log-probs (all scored before the first token) go with the first output only
        prompt_logprobs = req.prompt_logprobs
        if req.params.output_kind == RequestOutputKind.DELTA and any(s.sent_tokens for s in req.seqs):
            prompt_logprobs = None
        comps = [self._completion(seq) for seq in sorted(req.seqs, key=lambda s: s.index)]
        if req.finished:
            self.requests.pop(req.request_id, None)
        # the prompt's ids are never changed by the engine: every output shares the request's list
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, comps, req.finished, req.metrics,
                             prompt_logprobs)

    def _completion(self, seq: EngineSequence) -> CompletionOutput:
        delta = seq.take_delta()  # holds back a half character and a stop string's possible start
        ids, lps, sent = seq.output_token_ids, seq.logprobs, seq.sent_tokens
        new_ids = ids[sent:]
        seq.sent_tokens = len(ids)
        cumulative = None if lps is None else seq.cumulative_logprob
        if seq.params.output_kind == RequestOutputKind.DELTA:  # no copy of what was sent before
            return CompletionOutput(seq.index, delta, new_ids, seq.finish_reason, delta, new_ids,
                                    None if lps is None else lps[sent:], cumulative)
        return CompletionOutput(seq.index, seq.output_text(self.tokenizer), list(ids), seq.finish_reason, delta, new_ids,
                                None if lps is None else list(lps), cumulative)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    def kv_cache_stats(self) -> dict:
        s = self.block_manager.stats()
        s.update(block_size=self.config.block_size, usage=s["used_blocks"] / s["total_blocks"],
                 kv_cache_bytes=self.kv_cache.nbytes, num_running=self.num_running,
                 num_waiting=self.num_waiting, num_preemptions=self.num_preemptions)
        return s
