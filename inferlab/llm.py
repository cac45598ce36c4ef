"""The user-facing API, shaped like vLLM's: ``LLM(model=...).generate(prompts, SamplingParams(...))``.

``LLM`` loads the model once and runs every batch through its ``LLMEngine`` (``llm.llm_engine``):
paged KV cache, continuous batching, prefix caching and chunked prefill are knobs here
(see ``inferlab.engine.config`` for what each one does and its default).
"""
from __future__ import annotations

import dataclasses
import time


from inferlab.attention import get_backend
from inferlab.model.chat import Chat, ChatTemplate
from inferlab.device import default_device, parse_dtype
from inferlab.engine.config import EngineConfig
from inferlab.engine.llm_engine import LLMEngine
from inferlab.errors import InferlabError
from inferlab.model.loader import load_checkpoint
from inferlab.model.packing import pack_projections
from inferlab.outputs import CompletionOutput, RequestOutput
from inferlab.sampling import SamplingParams
from inferlab.spec.config import SpeculativeConfig

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "check_quantization", "load_model"]


class LLM:
    """Load a model once, then generate for batches of prompts.

    model: an embedded model name ("target", "draft"), an HF model folder, or a hub id.
    attention_backend: the attention seam ("torch"; more backends register themselves).
    block_size, num_kv_blocks, max_num_seqs, max_num_batched_tokens, max_model_len,
    enable_prefix_caching, enable_chunked_prefill, batching_policy ("continuous" or "static"),
    gpu_memory_utilization: the engine's knobs (``inferlab.engine.config``).
    scheduling_policy: vLLM's queue order, "fcfs" (default) or "priority": then ``generate``'s
        ``priority`` list orders the requests (lower first, ties by arrival) and the lowest
        priority is preempted first.
    speculative_config: speculative decoding as a mode of the engine's step, vLLM's dict:
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4} (prompt lookup) or
        {"model": "draft", "num_speculative_tokens": 4} (a draft model with the target's vocabulary) or
        {"method": "medusa", "num_speculative_tokens": 3} (Medusa heads, from <model>_medusa) or
        {"method": "eagle", "num_speculative_tokens": 4} (an EAGLE draft, from <model>_eagle).
    quantization: vLLM's argument. None (default): the weights as stored. A method of
        ``inferlab.quant.METHODS`` ("int8", "int4", "gptq", "awq", "nf4", "q8_0", "q4_0",
        "q4_k" ...): quantize the linears at load. "none": no quantization (a GGUF's blocks are
        dequantized to fp32; an ordinary folder loads as it is). A folder written by
        ``inferlab quantize`` is already quantized and needs no argument.
    max_logprobs, logprobs_mode: how many top tokens ``SamplingParams(logprobs=N, prompt_logprobs=N)``
        may ask for (20), and of which distribution: "raw_logprobs" (vLLM's default: the model's own)
        or "processed_logprobs" (after temperature, top-k, top-p); see ``inferlab.logprobs``.
    tensor_parallel_size: split the model over this many processes (``inferlab.parallel``; gloo on
        CPU, NCCL on CUDA). Call ``shutdown()`` to stop them (exiting the process does too).
    distributed_executor_backend: vLLM's name. "mp" runs the ranks as processes (the default when
        tensor_parallel_size > 1; with 1 it still takes that path, a check of the parallel layers);
        "uni" or None with one rank: everything in this process.
    """

    def __init__(self, model: str = "target", device: str | None = None, dtype: str | None = None,
                 attention_backend: str = "torch", block_size: int = 16, num_kv_blocks: int | None = None,
                 max_num_seqs: int = 64, max_num_batched_tokens: int | None = None,
                 max_model_len: int | None = None, enable_prefix_caching: bool = False,
                 enable_chunked_prefill: bool = False, batching_policy: str = "continuous",
                 gpu_memory_utilization: float = 0.9, quantization: str | None = None,
                 speculative_config: dict | None = None, scheduling_policy: str = "fcfs",
                 tensor_parallel_size: int = 1, enforce_eager: bool = True, max_logprobs: int = 20,
                 logprobs_mode: str = "raw_logprobs", distributed_executor_backend: str | None = None):
        config = EngineConfig(block_size, num_kv_blocks, max_num_seqs, max_num_batched_tokens, max_model_len,
                              enable_prefix_caching, enable_chunked_prefill, batching_policy,
                              gpu_memory_utilization, speculative_config, scheduling_policy, enforce_eager,
                              max_logprobs, logprobs_mode)
        spec = SpeculativeConfig.from_dict(speculative_config)  # a bad dict fails before anything loads
        if spec is not None and spec.method in ("medusa", "eagle") and spec.model is None:  # beside the model
            from inferlab.spec.eagle import eagle_folder_for
            from inferlab.spec.medusa import heads_folder_for
            folder = (heads_folder_for if spec.method == "medusa" else eagle_folder_for)(model)
            config.speculative_config = dataclasses.replace(spec, model=str(folder))
        backend = get_backend(attention_backend)  # check the knobs before loading anything
        quantization = check_quantization(quantization)
        if distributed_executor_backend not in (None, "mp", "uni"):
            raise InferlabError(f"distributed_executor_backend must be 'mp' (rank processes) or 'uni' (this "
                                f"process), got {distributed_executor_backend!r}")
        if distributed_executor_backend == "uni" and tensor_parallel_size != 1:
            raise InferlabError(f"tensor_parallel_size={tensor_parallel_size} needs rank processes: "
                                "use distributed_executor_backend='mp' (or leave it unset)")
        self.tensor_parallel_size, self.executor = tensor_parallel_size, None
        if tensor_parallel_size != 1 or distributed_executor_backend == "mp":
            # the ranks start first (even a world of one with "mp"); the engine runs on rank 0's shard
            from inferlab.parallel.launch import launch_parallel
            self.executor = launch_parallel(model, tensor_parallel_size, device, dtype, attention_backend, config,
                                            None if quantization == "none" else quantization, speculative_config)
            self.model, self.tokenizer = self.executor.model, self.executor.tokenizer
            self._start(backend, self.executor.engine_config, str(model))
            self.executor.attach(self.llm_engine)  # each engine step goes to the other ranks too
            return
        self.model, self.tokenizer, qcfg = load_model(model, device, parse_dtype(dtype, device or default_device()),
                                                      quantization)
        if qcfg is not None:
            self.quantization_config = qcfg
        self._start(backend, config, str(model))

    @classmethod
    def from_model(cls, model, tokenizer=None, attention_backend: str = "torch", **engine_knobs) -> "LLM":
        """An ``LLM`` over a model already in memory (a converted or quantized variant, a model being
        studied in a notebook), on the same engine; ``engine_knobs`` are ``EngineConfig``'s fields."""
        self = cls.__new__(cls)
        self.model, self.tokenizer = model, tokenizer
        self.tensor_parallel_size, self.executor = 1, None
        self._start(get_backend(attention_backend), EngineConfig(**engine_knobs), type(model).__name__)
        return self

    def _start(self, backend, config: EngineConfig, name: str) -> None:
        pack_projections(self.model)  # q/k/v and gate/up as one GEMM each (inferlab.model.packing)
        self.model.set_attention_backend(backend)
        self.model_name = name
        self.llm_engine = LLMEngine(self.model, self.tokenizer, config)
        self.last_stats: dict = {}
        self._ids = 0

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker processes, if any (safe to call twice)."""
        if self.executor is not None:
            self.executor.shutdown()

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.model.config.eos_token_ids

    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise InferlabError(f"{self.model_name} has no tokenizer.json: pass prompt_token_ids instead")
        return self.tokenizer.encode(prompt)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None,
             chat_template: str | ChatTemplate | None = None, add_generation_prompt: bool = True,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """Reply to one conversation (a list of {"role", "content"}) or to each of a list of them,
        as vLLM's ``LLM.chat``: each is rendered through the model's chat template (or
        ``chat_template``, Jinja source; ``chat_template_kwargs``: more template variables), encoded
        without adding special tokens again, and generated until the template's end-of-turn token
        (``inferlab.model.chat``), which the text leaves out. One output per conversation; its
        ``prompt`` is the rendered text."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        chat = Chat(self.tokenizer, chat_template)
        prompts = [chat.prompt(c, add_generation_prompt, **(chat_template_kwargs or {})) for c in conversations]
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        outs = self.generate(prompt_token_ids=[ids for _, ids in prompts],
                             sampling_params=[chat.sampling_params(sp) for sp in sampling_params])
        for out, (text, _) in zip(outs, prompts):
            out.prompt = text
        return outs

    def generate(self, prompts: str | list[str] | None = None,
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 prompt_token_ids: list[list[int]] | None = None,
                 priority: list[int] | None = None) -> list[RequestOutput]:
        """Generate for every prompt, all at once through the engine; outputs in prompt order.
        ``priority`` (vLLM's): one integer per prompt, lower served first; it needs an ``LLM``
        made with ``scheduling_policy="priority"``."""
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
        if priority is None:
            priority = [0] * n
        if len(priority) != n:
            raise InferlabError(f"got {len(priority)} priorities for {n} prompts: give one per prompt")
        engine = self.llm_engine
        before = dict(engine.counters)
        ids = []
        finals: dict[str, RequestOutput] = {}
        t0 = time.perf_counter()
        try:  # a bad prompt or an interrupt leaves nothing of this call queued in the engine
            for ids_, sp, prio in zip(prompt_token_ids, sampling_params, priority):
                rid = f"generate-{self._ids}"
                self._ids += 1
                engine.add_request(rid, list(ids_), sp, stream=False, priority=prio)
                ids.append(rid)
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        finals[out.request_id] = out
        except BaseException:
            for rid in ids:
                engine.abort_request(rid)
            raise
        self.last_stats = step_stats(before, engine.counters, time.perf_counter() - t0, n)
        results = []
        for rid, text in zip(ids, texts):
            out = finals[rid]
            out.request_id, out.prompt = str(len(results)), text
            results.append(out)
        return results


def check_quantization(method: str | None) -> str | None:
    """``method`` lower-cased if it is None, "none" or one of ``inferlab.quant.METHODS``; else an
    error naming the choices (an ``InferlabError``, which the CLI prints as one line, even from
    an argparse ``type=``: argparse turns only ValueError and TypeError into its usage screen)."""
    if method is None:
        return None
    from inferlab.quant.methods import METHODS

    choices = ("none", *METHODS)
    if str(method).lower() not in choices:
        raise InferlabError(f"unknown quantization {method!r}: choose one of {', '.join(choices)}")
    return str(method).lower()


def load_model(model: str, device=None, dtype=None, quantization: str | None = None):
    """``LLM``'s load: ``(model, tokenizer, quantization_config or None)`` for ``quantization``
    (see ``LLM``): any value but None reads a stored-quantized model (a GGUF) as fp32 first, and a
    method then quantizes its linears. The commands that load one model without an ``LLM``
    (``inferlab eval ppl``, ``inferlab bench spec``) load through this too."""
    quantization = check_quantization(quantization)
    net, tokenizer = load_checkpoint(model, device=device, dtype=dtype, dequantize=quantization is not None)
    if quantization in (None, "none"):
        return net, tokenizer, None
    from inferlab.quant import quantize_model
    from inferlab.quant.methods import METHODS
    # GPTQ and AWQ fit every layer to calibration data (minutes on smollm2): show how far they are
    calibrated = METHODS[quantization].calibrated
    return net, tokenizer, quantize_model(net, quantization, tokenizer=tokenizer, progress=calibrated)


def step_stats(before: dict, after: dict, seconds: float, batch: int) -> dict:
    """Prefill/decode times, token counts and rates between two snapshots of ``engine.counters``."""
    d = {k: after[k] - before[k] for k in before}
    return {"prefill_s": d["prefill_s"], "decode_s": d["decode_s"], "prefill_tokens": d["prefill_tokens"],
            "decode_steps": d["num_steps"], "batch_size": batch, "total_s": seconds,
            "prefill_tokens_per_s": d["prefill_tokens"] / max(d["prefill_s"], 1e-9),
            "decode_tokens_per_s": d["decode_tokens"] / max(d["decode_s"], 1e-9)}
