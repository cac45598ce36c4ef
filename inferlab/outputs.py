"""What generation returns, shaped like vLLM's ``RequestOutput`` / ``CompletionOutput``.

``text`` and ``token_ids`` are cumulative; for streaming, ``delta_text`` and ``delta_token_ids``
hold what is new since the request's previous output (``LLMEngine.step``).
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
