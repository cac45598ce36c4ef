"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) on torch.distributed: gloo on CPU, NCCL on CUDA.

    layers.py    ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, ParallelLMHead
    factory.py   which projection is which, by HF name (the linear seam); local head counts
    loader.py    each rank reads only its slices (safetensors get_slice)
    executor.py  rank 0 in the caller's process, ranks 1..N-1 as workers running the model runner
    comm.py      the all-reduce / all-gather the layers call, counted and timed

``LLM(model=..., tensor_parallel_size=N)`` uses all of it.
"""
from inferlab.parallel.comm import TensorParallelError
from inferlab.parallel.factory import TensorParallelFactory
from inferlab.parallel.layers import ColumnParallelLinear, ParallelLMHead, RowParallelLinear, VocabParallelEmbedding

__all__ = ["ColumnParallelLinear", "ParallelLMHead", "RowParallelLinear", "TensorParallelError",
           "TensorParallelFactory", "VocabParallelEmbedding"]
