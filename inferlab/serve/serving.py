"""The OpenAI endpoints' logic: a request body in, engine requests out, OpenAI JSON or SSE back.

One HTTP request may become several engine requests: a list of prompts gives one each (their
``n`` completions are forked inside the engine). Their outputs are merged as they come, and choice
``i * n + j`` is completion ``j`` of prompt ``i``, as in OpenAI's API. Streaming answers are
server-sent events: ``data: {json}`` per chunk, then ``data: [DONE]``; other answers are added to
the engine final-only, so nothing crosses the threads until they finish.

The event loop only routes: tokenizing a prompt and rendering a chat template (milliseconds to
seconds for a long prompt) run on a worker thread, as in vLLM, so one large request never stalls
the other clients' streams or ``/health``. Requests are admitted while the engine's waiting queue
has room (``limits.py``); beyond it they get 429 at once instead of joining a backlog.

Log-probs ride on the same outputs: the engine scores the tokens of the requests that ask
(``SamplingParams.logprobs`` / ``prompt_logprobs``), and each choice, or each streamed chunk, carries
those of its own tokens in OpenAI's shape (``protocol.CompletionLogprobs``, ``protocol.ChatLogprobs``).
An echoed prompt is sent with the first chunk of its choice, once its log-probs exist.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from typing import AsyncIterator

from inferlab.model.chat import Chat, ChatTemplate, ChatTemplateError
from inferlab.model.context import ContextLengthError, fit_max_tokens
from inferlab.outputs import RequestOutput
from inferlab.serve import protocol as P
from inferlab.serve.async_engine import AsyncLLMEngine
from inferlab.serve.limits import QueueFullError, ServerLimits, request_problem
from inferlab.serve.streams import EventStream, RequestStream, collect_finals, merge_streams, sse


class ApiError(Exception):
    """A request the server refuses: becomes an OpenAI-style JSON error with this status."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


class OpenAIServing:
    def __init__(self, engine: AsyncLLMEngine, tokenizer, model_name: str,
                 chat_template: ChatTemplate | None = None, root: str | None = None,
                 limits: ServerLimits | None = None):
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        # the model's own template (its tokenizer carries it), unless the caller gives another
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None) or ChatTemplate()
        self.root = root
        self.limits = limits or ServerLimits()
        # one worker, as vLLM's tokenizer executor: prompts are tokenized in arrival order
        self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="inferlab-tokenize")
        self.num_admitting = 0  # requests between arrival and the engine's queue (tokenizing, in flight)
        self.num_jobs = 0       # tokenizer jobs submitted and not yet ended
        cfg = engine.engine.config
        self.max_model_len = cfg.max_model_len
        self.pool_slots = cfg.num_kv_blocks * cfg.block_size
        self.vocab_size = engine.engine.model.config.vocab_size
        self.max_logprobs = cfg.max_logprobs

    def models(self) -> P.ModelList:
        return P.ModelList(data=[P.ModelCard(id=self.model_name, root=self.root, max_model_len=self.max_model_len)])

    # ---- checks shared by both endpoints ------------------------------------------------------
    def _check(self, req: P.SamplingFields) -> None:
        if req.model is not None and req.model != self.model_name:
            raise ApiError(f"The model `{req.model}` does not exist: this server serves `{self.model_name}`",
                           404, "model")
        problem = req.unsupported()
        if problem:
            raise ApiError(problem)
        capped = req.logprobs_problem(self.max_logprobs) or request_problem(req, self.limits)
        if capped:
            raise ApiError(capped[0], param=capped[1])

    async def _off_loop(self, fn, *args):
        """``fn(*args)`` on the tokenizer thread, so the event loop keeps serving meanwhile. A job
        counts until it ends, even when its client left: a job that cannot be called back still
        holds its place at the door."""
        loop = asyncio.get_running_loop()
        job = self.executor.submit(fn, *args)
        self.num_jobs += 1

        def done(_):
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
                loop.call_soon_threadsafe(self._job_done)

        job.add_done_callback(done)
        return await asyncio.wrap_future(job)

    def _job_done(self) -> None:
        self.num_jobs -= 1

    @contextlib.contextmanager
    def _admission(self):
        """Count a request from arrival until the engine has queued it; refuse it at the door when
        as many are already on their way as the waiting queue holds."""
        busy = max(self.num_admitting, self.num_jobs)
        if busy >= self.limits.max_waiting_requests:
            raise QueueFullError(f"the server is busy: {busy} requests are being admitted "
                                 f"(at most {self.limits.max_waiting_requests}): retry later")
        self.num_admitting += 1
        try:
            yield
        finally:
            self.num_admitting -= 1

    def _max_tokens(self, requested: int | None, prompt_len: int) -> int:
        try:  # the rule lives in inferlab/model/context.py; the server refuses what does not fit
            return fit_max_tokens(requested, prompt_len, min(self.max_model_len, self.pool_slots), strict=True,
                                  context_name="model's context")
        except ContextLengthError as err:
            raise ApiError(str(err), param=err.param) from None

    def _encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.tokenizer is None:
            raise ApiError("this model has no tokenizer.json: send the prompt as a list of token ids", param="prompt")
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def _prompts(self, prompt) -> list[list[int]]:
        if isinstance(prompt, str):
            prompts = [self._encode(prompt)]
        elif prompt and all(isinstance(p, int) for p in prompt):
            prompts = [list(prompt)]
        elif prompt and all(isinstance(p, str) for p in prompt):
            prompts = [self._encode(p) for p in prompt]
        elif prompt and all(isinstance(p, list) for p in prompt):
            prompts = [list(p) for p in prompt]
        else:
            raise ApiError("prompt must be a string, a list of strings, or token ids", param="prompt")
        for ids in prompts:
            if not ids:
                raise ApiError("the prompt is empty: give at least one token", param="prompt")
            if any(not 0 <= t < self.vocab_size for t in ids):
                raise ApiError(f"prompt token ids must be in [0, {self.vocab_size})", param="prompt")
        return prompts

    async def _submit(self, request_id: str, prompts: list[list[int]], req, max_tokens: int | None,
                      arrival: float, chat: Chat | None = None) -> list[RequestStream]:
        """All prompts queued in the engine together (or none), streaming or final-only; a ``chat``
        request also stops at its template's end-of-turn token."""
        batch = []
        for i, ids in enumerate(prompts):
            try:
                params = req.sampling_params(self._max_tokens(max_tokens, len(ids)))
                if chat is not None:
                    params = chat.sampling_params(params)
            except ValueError as exc:
                raise ApiError(str(exc)) from None
            batch.append((f"{request_id}-{i}", ids, params))
        try:
            return await self.engine.add_requests(batch, stream=req.stream, arrival_time=arrival,
                                                  max_waiting=self.limits.max_waiting_requests, priority=req.priority)
        except ValueError as exc:
            raise ApiError(str(exc)) from None

    # ---- /v1/completions ----------------------------------------------------------------------
    async def completions(self, req: P.CompletionRequest):
        """A CompletionResponse, or an EventStream when ``req.stream``."""
        arrival = time.monotonic()
        self._check(req)
        with self._admission():
            prompts = await self._off_loop(self._prompts, req.prompt)
            rid = P.new_id("cmpl")
            # scoring only (echo, max_tokens 0): the engine generates one token, which is not sent (as vLLM)
            streams = await self._submit(rid, prompts, req, 1 if req.score_only else req.max_tokens, arrival)
        try:
            echo = await self._off_loop(self._echo, prompts) if req.echo else [""] * len(prompts)
        except BaseException:
            for s in streams:
                s.abort()
            raise
        if req.stream:
            return EventStream(self._completion_events(rid, req, streams, prompts, echo), streams)
        finals = await collect_finals(streams)
        choices = [self._completion_choice(i * req.n + c.index, req, out, c, echo[i])
                   for i, out in enumerate(finals) for c in out.outputs]
        return P.CompletionResponse(id=rid, model=self.model_name, choices=choices,
                                    usage=_usage(finals, req.score_only))

    def _echo(self, prompts: list[list[int]]) -> list[str]:
        return [self.tokenizer.decode(ids) if self.tokenizer else "" for ids in prompts]

    def _decode_token(self, token_id: int) -> str | None:
        return self.tokenizer.decode([token_id], skip_special_tokens=False) if self.tokenizer else None

    def _completion_choice(self, index: int, req, out: RequestOutput, c, echo: str) -> P.CompletionChoice:
        """One finished choice: the echoed prompt, then the generated text (none when only scoring),
        with the log-probs of both when asked."""
        logprobs = None
        if req.logprobs is not None:
            ids, entries = (list(out.prompt_token_ids), list(out.prompt_logprobs)) if req.echo else ([], [])
            if not req.score_only:
                ids, entries = ids + c.token_ids, entries + c.logprobs
            logprobs = P.CompletionLogprobs.of(ids, entries, decode=self._decode_token)
        return P.CompletionChoice(index=index, text=echo + ("" if req.score_only else c.text), logprobs=logprobs,
                                  finish_reason="length" if req.score_only else c.finish_reason)

    async def _completion_events(self, rid, req, streams, prompts, echo) -> AsyncIterator[str]:
        def chunk(choices, usage=None):
            return P.CompletionResponse(id=rid, model=self.model_name, choices=choices, usage=usage)

        def logprobs(ids, entries, index):  # text_offset goes on from the choice's tokens sent so far
            lp = P.CompletionLogprobs.of(ids, entries, offsets[index], self._decode_token)
            if lp.tokens:
                offsets[index] = lp.text_offset[-1] + len(lp.tokens[-1])
            return lp

        offsets: dict[int, int] = {}  # choice index -> where its next token starts (once it has begun)
        finals = []
        async for event in self._deltas(streams, req.n):
            if isinstance(event, list):
                finals = event
                continue
            index, text, reason, new, out = event
            if index not in offsets:
                offsets[index] = 0
                if req.echo:
                    lp = None if req.logprobs is None else logprobs(out.prompt_token_ids, out.prompt_logprobs, index)
                    yield sse(chunk([P.CompletionChoice(index=index, text=echo[index // req.n], logprobs=lp)]))
            if req.score_only:
                if reason:
                    yield sse(chunk([P.CompletionChoice(index=index, text="", finish_reason="length")]))
                continue
            lp = None if new is None else logprobs(*new, index)
            yield sse(chunk([P.CompletionChoice(index=index, text=text, logprobs=lp, finish_reason=reason)]))
        if req.stream_options and req.stream_options.include_usage and finals:
            yield sse(chunk([], _usage(finals, req.score_only)))

    # ---- /v1/chat/completions -----------------------------------------------------------------
    async def chat(self, req: P.ChatCompletionRequest):
        arrival = time.monotonic()
        self._check(req)
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        with self._admission():
            ids, chat = await self._off_loop(self._chat_prompt, messages)
            rid = P.new_id("chatcmpl")
            max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
            streams = await self._submit(rid, [ids], req, max_tokens, arrival, chat)
        if req.stream:
            return EventStream(self._chat_events(rid, req, streams), streams)
        (out,) = await collect_finals(streams)
        choices = [P.ChatChoice(index=c.index, message=P.ChatMessageOut(content=c.text),
                                logprobs=self._chat_logprobs(req, c.token_ids, c.logprobs),
                                finish_reason=c.finish_reason) for c in out.outputs]
        return P.ChatCompletionResponse(id=rid, model=self.model_name, choices=choices, usage=_usage([out]))

    def _chat_prompt(self, messages: list[dict]) -> tuple[list[int], Chat]:
        """The prompt's ids and the ``Chat`` that made them: ``LLM.chat``'s path, so the server
        prompts and stops as the offline API does."""
        if self.tokenizer is None:
            raise ApiError("this model has no tokenizer.json: use /v1/completions with token ids", param="messages")
        chat = Chat(self.tokenizer, self.chat_template)
        try:
            _, ids = chat.prompt(messages)
        except ChatTemplateError as exc:  # the template refused the conversation, or does not compile
            raise ApiError(str(exc), param="messages") from None
        if not ids:
            raise ApiError("the messages are empty: give some content", param="messages")
        return ids, chat

    @staticmethod
    def _chat_logprobs(req, token_ids, entries) -> P.ChatLogprobs | None:
        return P.ChatLogprobs.of(token_ids, entries, req.top_logprobs or 0) if req.logprobs else None

    async def _chat_events(self, rid, req, streams) -> AsyncIterator[str]:
        def chunk(choices, usage=None):
            return P.ChatCompletionChunk(id=rid, model=self.model_name, choices=choices, usage=usage)

        yield sse(chunk([P.ChatStreamChoice(index=j, delta=P.DeltaMessage(role="assistant", content=""))
                          for j in range(req.n)]))
        finals = []
        async for event in self._deltas(streams, req.n):
            if isinstance(event, list):
                finals = event
            else:
                index, text, reason, new, _ = event
                delta = P.DeltaMessage(content=text) if text or reason is None else P.DeltaMessage()
                lp = None if new is None else self._chat_logprobs(req, *new)
                yield sse(chunk([P.ChatStreamChoice(index=index, delta=delta, logprobs=lp, finish_reason=reason)]))
        if req.stream_options and req.stream_options.include_usage and finals:
            yield sse(chunk([], _usage(finals)))

    # ---- streaming, shared ----------------------------------------------------------------------
    async def _deltas(self, streams, n: int):
        """(choice index, new text, finish reason or None, (new token ids, their log-prob entries) or
        None, the request's output) per change; the final outputs at the end. With log-probs, new
        tokens make a change even while their text is held back (half a character)."""
        finished, finals = set(), [None] * len(streams)
        async for i, out in merge_streams(streams):
            for c in out.outputs:
                index = i * n + c.index
                new = None
                if c.logprobs is not None and c.delta_token_ids:  # the last ones: a cumulative list
                    new = (c.delta_token_ids, c.logprobs[len(c.logprobs) - len(c.delta_token_ids):])
                if index in finished or not (c.delta_text or c.finish_reason or new):
                    continue
                if c.finish_reason:
                    finished.add(index)
                yield index, c.delta_text, c.finish_reason, new, out
            if out.finished:
                finals[i] = out
        yield finals


def _usage(finals: list[RequestOutput], score_only: bool = False) -> P.UsageInfo:
    prompt = sum(len(o.prompt_token_ids) for o in finals)
    completion = 0 if score_only else sum(len(c.token_ids) for o in finals for c in o.outputs)
    return P.UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
