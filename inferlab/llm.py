"""The user-facing API, shaped like vLLM's: ``LLM(model=...).generate(prompts, SamplingParams(...))``."""
from __future__ import annotations

import dataclasses

import torch

from inferlab.attention import get_backend
from inferlab.device import parse_dtype
from inferlab.errors import InferlabError
from inferlab.generate import generate
from inferlab.loader import load_checkpoint
from inferlab.sampling import SamplingParams


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclasses.dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


class LLM:
    """Load a model once, then generate for batches of prompts.

    model: an embedded model name ("target", "draft"), an HF model folder, or a hub id.
    attention_backend: the attention seam ("torch"; more backends register themselves).
    quantization: quantize the linears at load ("int8", "int4", "gptq", "awq", "nf4", "q8_0",
        "q4_0", "q4_k"; see ``inferlab.quant``). A folder written by ``inferlab quantize`` is
        already quantized and needs no argument.
    """

    def __init__(self, model: str = "target", device: str | None = None, dtype: str | None = None,
                 attention_backend: str = "torch", quantization: str | None = None):
        self.model, self.tokenizer = load_checkpoint(model, device=device,
                                                     dtype=parse_dtype(dtype, device or _auto_device()))
        if quantization is not None:
            from inferlab.quant import quantize_model
            self.quantization_config = quantize_model(self.model, quantization, tokenizer=self.tokenizer,
                                                      progress=False)
        self.model.set_attention_backend(get_backend(attention_backend))
        self.model_name = str(model)
        self.last_stats: dict = {}

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.model.config.eos_token_ids

    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise InferlabError(f"{self.model_name} has no tokenizer.json: pass prompt_token_ids instead")
        return self.tokenizer.encode(prompt)

    def generate(self, prompts: str | list[str] | None = None,
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 prompt_token_ids: list[list[int]] | None = None) -> list[RequestOutput]:
        if prompts is None and prompt_token_ids is None:
            raise InferlabError("give prompts (strings) or prompt_token_ids")
        if isinstance(prompts, str):
            prompts = [prompts]
        if prompt_token_ids is None:
            prompt_token_ids = [self.encode(p) for p in prompts]
        texts = prompts if prompts is not None else [None] * len(prompt_token_ids)
        n = len(prompt_token_ids)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * n
        if len(sampling_params) != n:
            raise InferlabError(f"got {len(sampling_params)} SamplingParams for {n} prompts: give one, or one per prompt")
        self.last_stats = {}
        seqs = generate(self.model, prompt_token_ids, list(sampling_params), self.eos_token_ids,
                        self.tokenizer, stats=self.last_stats)
        return [self._output(i, t, s) for i, (t, s) in enumerate(zip(texts, seqs))]

    def _output(self, i: int, prompt: str | None, seq) -> RequestOutput:
        comp = CompletionOutput(0, seq.output_text(self.tokenizer), list(seq.output_token_ids), seq.finish_reason)
        return RequestOutput(str(i), prompt, list(seq.prompt_token_ids), [comp])


def _auto_device():
    return "cuda" if torch.cuda.is_available() else "cpu"
