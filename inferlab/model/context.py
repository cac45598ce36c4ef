"""How many tokens fit after a prompt: one rule for the engine, the server and the contiguous path.

A sequence (prompt + generated tokens) must fit the context: the model's positions, or the
engine's ``max_model_len`` (and KV pool). A prompt that fills it leaves no room and is refused.
Asking for more tokens than fit is a choice of policy: the OpenAI server refuses it with a 400
(``strict``, as vLLM's server does), while ``LLM.generate`` and ``inferlab generate`` stop at the
context's end with ``finish_reason == "length"`` (as vLLM's offline ``LLM`` does).
"""
from __future__ import annotations


class ContextLengthError(ValueError):
    """The prompt, or prompt + max_tokens, does not fit; ``param`` names the field to change."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def tokens_after_prompt(prompt_len: int, context: int, context_name: str = "context") -> int:
    """Room for generated tokens after a prompt of ``prompt_len`` tokens (at least 1, or an error)."""
    if prompt_len >= context:
        raise ContextLengthError(f"the prompt has {prompt_len} tokens, but the {context_name} is {context} tokens: "
                                 f"shorten the prompt", "prompt")
    return context - prompt_len


def fit_max_tokens(requested: int | None, prompt_len: int, context: int, strict: bool = False,
                   context_name: str = "context") -> int:
    """The max_tokens to run with: all the room when None; ``requested`` when it fits; otherwise
    the room (clamped) or, with ``strict``, a ContextLengthError."""
    room = tokens_after_prompt(prompt_len, context, context_name)
    if requested is None:
        return room
    if requested < 1:
        raise ContextLengthError(f"max_tokens must be at least 1, got {requested}", "max_tokens")
    if requested > room and strict:
        raise ContextLengthError(
            f"this model's maximum context length is {context} tokens, but {prompt_len + requested} were "
            f"requested ({prompt_len} in the prompt, {requested} to generate): lower max_tokens or shorten "
            f"the prompt", "max_tokens")
    return min(requested, room)
