"""``LLM(..., tensor_parallel_size=N)``: start the ranks, then run the usual engine on rank 0.

``launch_parallel`` checks the request and starts the ranks; the executor it returns holds rank
0's shard (``.model``, ``.tokenizer``), the engine config every rank agreed on
(``.engine_config``) and rank 0's collectives (``.comm``). ``LLM`` builds its engine over that
shard and hands it to ``executor.attach``, which sends each of its steps to the other ranks too;
the executor stays on ``llm.executor`` (``shutdown()`` stops the ranks).

``llm.model`` is then rank 0's shard: its forward takes part in collectives, so run it through
the engine (``generate``, ``llm_engine.runner``).
"""
from __future__ import annotations

from inferlab.device import default_device, parse_dtype
from inferlab.parallel.comm import TensorParallelError
from inferlab.parallel.executor import TensorParallelExecutor
from inferlab.parallel.factory import TensorParallelFactory


def launch_parallel(model: str, world: int, device, dtype, attention_backend: str, config,
                    quantization, speculative_config) -> TensorParallelExecutor:
    """Refuse what cannot run on ``world`` ranks (before any process starts), then start them."""
    if not isinstance(world, int) or world < 1:
        raise TensorParallelError(f"tensor_parallel_size must be an integer >= 1, got {world!r}")
    if quantization is not None:
        raise TensorParallelError("quantizing at load does not shard: write a quantized folder first (`inferlab "
                                  "quantize --model M --method int8 --out DIR`), then load DIR with tensor_parallel_size=N")
    if speculative_config is not None:
        raise TensorParallelError("speculative decoding runs with tensor_parallel_size=1 only")
    from inferlab.model.loader import hf_model_folder, load_config
    folder = hf_model_folder(model)  # a GGUF's blocks do not shard: the ranks read its fp32 folder
    # heads that do not divide, and the like: refused before any process starts
    TensorParallelFactory(load_config(folder), 0, world)
    device = device or default_device()
    if str(device).startswith("cuda"):
        import torch
        if torch.cuda.device_count() < world:
            raise TensorParallelError(f"tensor_parallel_size={world} needs {world} CUDA devices, "
                                      f"found {torch.cuda.device_count()}")
    return TensorParallelExecutor(str(folder), world, device, parse_dtype(dtype, device), attention_backend, config)

