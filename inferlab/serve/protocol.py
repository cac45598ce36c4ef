"""The OpenAI API's request and response bodies, as pydantic models with OpenAI's field names.

Only what the engine can honour is accepted: fields that would change the answer and that the
engine lacks (``logprobs``, ``suffix``, tools, ``best_of > n``...) are refused with a 400 rather than
silently ignored; fields that change nothing here (``user``, ``presence_penalty=0``...) are ignored,
as vLLM does. ``top_k`` and ``ignore_eos`` are vLLM's extensions of the API.
"""
from __future__ import annotations

import time
import uuid
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from inferlab.sampling import SamplingParams


class OpenAIModel(BaseModel):
    # NaN and Infinity are refused: a NaN temperature would poison the step it shares with others
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(OpenAIModel):
    include_usage: bool = False


class SamplingFields(OpenAIModel):
    """The sampling fields completions and chat share."""

    model: Optional[str] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    n: int = 1
    seed: Optional[int] = Field(None, ge=-(2**63), lt=2**64)  # what a torch.Generator takes
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, float]] = None
    priority: int = 0  # vLLM's extra field: lower is served first under --scheduling-policy priority

    def unsupported(self) -> str | None:
        """The first field set to something the engine cannot do, as a one-line message."""
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                return f"{name} is not supported by this server: leave it unset or 0"
        if self.logit_bias:
            return "logit_bias is not supported by this server: leave it unset"
        return None

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """Engine parameters; OpenAI's defaults (temperature 1, top_p 1). Raises ValueError."""
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k in (None, 0) else self.top_k,
            seed=self.seed, max_tokens=max_tokens, stop=self.stop, stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos, n=self.n)


class CompletionRequest(SamplingFields):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: Optional[int] = 16  # OpenAI's default for completions
    echo: bool = False
    logprobs: Optional[int] = None
    suffix: Optional[str] = None
    best_of: Optional[int] = None

    def unsupported(self) -> str | None:
        if self.logprobs is not None:
            return "logprobs is not supported by this server: leave it unset"
        if self.suffix:
            return "suffix (fill-in-the-middle) is not supported by this server: leave it unset"
        if self.best_of is not None and self.best_of != self.n:
            return "best_of other than n is not supported by this server: leave it unset"
        return super().unsupported()


class TextPart(OpenAIModel):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[TextPart]]] = None
    name: Optional[str] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = None            # default: what the context has room for
    max_completion_tokens: Optional[int] = None  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    tools: Optional[list[dict]] = None
    response_format: Optional[dict] = None

    def unsupported(self) -> str | None:
        if self.logprobs:
            return "logprobs is not supported by this server: leave it unset"
        if self.tools:
            return "tools (function calling) are not supported by this server: leave them unset"
        if self.response_format and self.response_format.get("type", "text") != "text":
            return "response_format other than text is not supported by this server"
        return super().unsupported()


# ---- responses ------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: Optional[str] = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Optional[UsageInfo] = None


class DeltaMessage(BaseModel):
    role: Optional[str] = None
    content: Optional[str] = None


class ChatMessageOut(BaseModel):
    role: str = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: None = None
    finish_reason: Optional[str] = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: None = None
    finish_reason: Optional[str] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: Optional[UsageInfo] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "inferlab"
    root: Optional[str] = None
    max_model_len: Optional[int] = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def error_body(message: str, param: str | None = None, status: int = 400) -> dict:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
            405: "MethodNotAllowedError", 429: "RateLimitError", 503: "ServiceUnavailableError"}.get(
        status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
