"""The OpenAI API's request and response bodies, as pydantic models with OpenAI's field names.

Only what the engine can honour is accepted: fields that would change the answer and that the
engine lacks (``suffix``, tools, ``best_of > n``...) are refused with a 400 rather than
silently ignored; fields that change nothing here (``user``, ``presence_penalty=0``...) are ignored,
as vLLM does. ``top_k`` and ``ignore_eos`` are vLLM's extensions of the API.

Log-probabilities come in OpenAI's two shapes, built from the engine's ``{token_id: Logprob}``
entries (``inferlab.logprobs``): completions' ``logprobs: N`` gives parallel lists (``tokens``,
``token_logprobs``, ``top_logprobs``: the chosen token and the N best, ``text_offset``: where each
token starts in the choice's text); ``echo`` with ``logprobs`` scores the prompt too (its first
token has None), and ``echo`` with ``max_tokens: 0`` scores the prompt alone (what evaluation
harnesses send). Chat's ``logprobs: true`` with ``top_logprobs: N`` gives a ``content`` list, one
``{token, logprob, bytes, top_logprobs}`` per token. A log-prob of -inf (a token filtered out
under ``processed_logprobs``) is sent as -9999.0, as vLLM does: JSON has no infinity.
"""
from __future__ import annotations

import time
import uuid
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from inferlab.logprobs import Logprob
from inferlab.sampling import SamplingParams
from inferlab.structured import StructuredOutputsParams

LOGPROB_FLOOR = -9999.0  # vLLM's stand-in for -inf in JSON


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
    # structured outputs (inferlab.structured): OpenAI's response_format, vLLM's structured_outputs
    # and its older guided_* fields; at most one of them
    response_format: Optional[dict] = None
    structured_outputs: Optional[dict] = None
    guided_json: Optional[Union[dict, str]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None

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
            ignore_eos=self.ignore_eos, n=self.n, logprobs=self.num_logprobs(),
            prompt_logprobs=self.num_prompt_logprobs(), structured_outputs=self.structured_outputs_params())

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """The one constraint the request sets, from whichever field set it. Raises ValueError.
        JSON asked through ``response_format`` or ``guided_json`` comes in its compact form (no
        whitespace the schema does not need: a small model left free to add whitespace can spend
        its whole budget on it), as vLLM serves it with ``disable_any_whitespace``; a body's
        ``structured_outputs`` says for itself."""
        given = {}
        rf = self.response_format
        if rf is not None:
            kind = rf.get("type", "text")
            if kind == "json_object":
                given["response_format"] = StructuredOutputsParams(json_object=True, disable_any_whitespace=True)
            elif kind == "json_schema":
                spec = rf.get("json_schema")
                if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                    raise ValueError('response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}')
                given["response_format"] = StructuredOutputsParams(json=spec["schema"], disable_any_whitespace=True)
            elif kind != "text":
                raise ValueError(f"response_format type must be text, json_object or json_schema, got {kind!r}")
        if self.structured_outputs is not None:
            given["structured_outputs"] = StructuredOutputsParams.coerce(self.structured_outputs)
        for name, field in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                            ("guided_grammar", "grammar")):
            if getattr(self, name) is not None:
                given[name] = StructuredOutputsParams(**{field: getattr(self, name)},
                                                      disable_any_whitespace=field == "json")
        if len(given) > 1:
            raise ValueError(f"give one constraint, not {' and '.join(given)}")
        return next(iter(given.values()), None)

    def num_logprobs(self) -> int | None:
        """``SamplingParams.logprobs``: how many top tokens per generated token, None for none."""
        return None

    def num_prompt_logprobs(self) -> int | None:
        return None

    def logprobs_problem(self, cap: int) -> tuple[str, str] | None:
        """(one-line message, param) when the log-prob fields ask for what the server cannot give."""
        return None


class CompletionRequest(SamplingFields):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: Optional[int] = 16  # OpenAI's default for completions
    echo: bool = False
    logprobs: Optional[int] = None
    suffix: Optional[str] = None
    best_of: Optional[int] = None

    @property
    def score_only(self) -> bool:
        """``echo`` with ``max_tokens: 0``: score the prompt, generate nothing (lm-eval's request)."""
        return self.echo and self.max_tokens == 0

    def num_logprobs(self) -> int | None:
        return self.logprobs

    def num_prompt_logprobs(self) -> int | None:
        return self.logprobs if self.echo else None

    def logprobs_problem(self, cap: int) -> tuple[str, str] | None:
        if self.logprobs is not None and not 0 <= self.logprobs <= cap:
            return (f"logprobs must be an integer from 0 to {cap}, got {self.logprobs}: ask for at most "
                    f"{cap} top tokens", "logprobs")
        return None

    def unsupported(self) -> str | None:
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
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = None
    tools: Optional[list[dict]] = None

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def logprobs_problem(self, cap: int) -> tuple[str, str] | None:
        if self.top_logprobs is not None and not self.logprobs:
            return "top_logprobs needs logprobs: true: set logprobs, or leave top_logprobs unset", "top_logprobs"
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= cap:
            return (f"top_logprobs must be an integer from 0 to {cap}, got {self.top_logprobs}: ask for at most "
                    f"{cap} top tokens", "top_logprobs")
        return None

    def unsupported(self) -> str | None:
        if self.tools:
            return "tools (function calling) are not supported by this server: leave them unset"
        return super().unsupported()


# ---- responses ------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogprobs(BaseModel):
    """OpenAI's completions log-probs: four lists, one entry per token of the choice's text."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)

    @classmethod
    def of(cls, token_ids: list[int], entries: list, offset: int = 0, decode=None) -> "CompletionLogprobs":
        """From the engine's entries (None for a prompt's first token, scored by nothing, whose
        text ``decode(id)`` gives); ``offset``: where the first token starts in the choice's text."""
        out = cls()
        for tok, entry in zip(token_ids, entries):
            chosen = entry[tok] if entry is not None else None
            text = _token_text(tok, chosen, decode)
            out.text_offset.append(offset)
            out.tokens.append(text)
            out.token_logprobs.append(None if chosen is None else _json_logprob(chosen.logprob))
            out.top_logprobs.append(None if entry is None else
                                    {_token_text(t, v, decode): _json_logprob(v.logprob) for t, v in entry.items()})
            offset += len(text)
        return out


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
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


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    """OpenAI's chat log-probs: one entry per generated token, each with its ``top_logprobs``."""

    content: Optional[list[ChatTokenLogprob]] = None
    refusal: Optional[list[ChatTokenLogprob]] = None

    @classmethod
    def of(cls, token_ids: list[int], entries: list, top: int) -> "ChatLogprobs":
        """From the engine's entries: the chosen token, then the ``top`` most likely (the chosen
        one among them only if it is one of them)."""
        content = []
        for tok, entry in zip(token_ids, entries):
            best = sorted(((t, v) for t, v in entry.items() if t != tok or v.rank <= top), key=lambda tv: -tv[1].logprob)
            content.append(ChatTokenLogprob(**_top(tok, entry[tok]).model_dump(),
                                            top_logprobs=[_top(t, v) for t, v in best[:top]]))
        return cls(content=content)


def _top(tok: int, v: Logprob) -> TopLogprob:
    text = _token_text(tok, v, None)
    return TopLogprob(token=text, logprob=_json_logprob(v.logprob), bytes=list(text.encode("utf-8")))


def _token_text(tok: int | None, v: Logprob | None, decode) -> str:
    """A token's text: the engine's decoded token, else ``decode(id)``, else vLLM's "token_id:N"."""
    if v is not None and v.decoded_token is not None:
        return v.decoded_token
    if decode is not None and tok is not None:
        return decode(tok)
    return f"token_id:{tok}"


def _json_logprob(x: float) -> float:
    return max(x, LOGPROB_FLOOR)


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChatLogprobs] = None
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
