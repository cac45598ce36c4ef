"""What generation returns, shaped like vLLM's ``RequestOutput`` / ``CompletionOutput``.

``text`` and ``token_ids`` are cumulative; for streaming, ``delta_text`` and ``delta_token_ids``
hold what is new since the request's previous output (``LLMEngine.step``). With
``SamplingParams(logprobs=N)``, ``logprobs`` holds one ``{token_id: Logprob}`` per token of
``token_ids`` (``inferlab.logprobs``) and ``cumulative_logprob`` their sum; with
``prompt_logprobs=N``, ``RequestOutput.prompt_logprobs`` one per prompt token (None for the first).
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    delta_text: str = ""
    delta_token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[dict] | None = None       # SampleLogprobs, None unless the request asked
    cumulative_logprob: float | None = None  # sum of the generated tokens' log-probs so far

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclasses.dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    metrics: object | None = None  # inferlab.engine.request.RequestMetrics when run by the engine
    prompt_logprobs: list | None = None  # PromptLogprobs, None unless the request asked
