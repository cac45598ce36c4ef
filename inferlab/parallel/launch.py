"""``LLM(..., tensor_parallel_size=N)``: start the ranks, then run the usual engine on rank 0.

``llm.model`` is then rank 0's shard: its forward takes part in collectives, so run it through
the engine (``generate``, ``llm_engine.runner``), which sends every step to the other ranks too.
"""
from __future__ import annotations

import weakref

from inferlab.device import default_device, parse_dtype
from inferlab.parallel.executor import ParallelRunner, TensorParallelExecutor
from inferlab.parallel.comm import TensorParallelError
from inferlab.parallel.factory import TensorParallelFactory


def start_parallel(llm, model: str, world: int, device, dtype, attention_backend: str, config,
                   quantization, speculative_config) -> None:
    if not isinstance(world, int) or world < 1:
        raise TensorParallelError(f"tensor_parallel_size must be an integer >= 1, got {world!r}")
    if quantization is not None:
        raise TensorParallelError("quantizing at load does not shard: write a quantized folder first (`inferlab "
                                  "quantize --model M --method int8 --out DIR`), then load DIR with tensor_parallel_size=N")
    if speculative_config is not None:
        raise TensorParallelError("speculative decoding runs with tensor_parallel_size=1 only")
    from inferlab.loader import hf_model_folder, load_config
    folder = hf_model_folder(model)  # a GGUF's blocks do not shard: the ranks read its fp32 folder
    # heads that do not divide, and the like: refused before any process starts
    TensorParallelFactory(load_config(folder), 0, world)
    device = device or default_device()
    if str(device).startswith("cuda"):
        import torch
        if torch.cuda.device_count() < world:
            raise TensorParallelError(f"tensor_parallel_size={world} needs {world} CUDA devices, "
                                      f"found {torch.cuda.device_count()}")
    tp = TensorParallelExecutor(str(folder), world, device, parse_dtype(dtype, device), attention_backend, config)
    llm._tp = tp
    llm.model, llm.tokenizer = tp.model, tp.tokenizer
    from inferlab.attention import get_backend
    llm._start(get_backend(attention_backend), tp.engine_config, str(model))
    llm.llm_engine.runner = ParallelRunner(llm.llm_engine.runner, tp)
    # the workers live as long as the engine (a server keeps the engine and drops the LLM)
    weakref.finalize(llm.llm_engine, tp.shutdown)
    llm.tensor_parallel_size = world
