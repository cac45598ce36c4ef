"""Tensor parallelism at TP=1 through the launch path, against the plain engine (scripts/gpu_check.sh).

``LLM(..., tensor_parallel_size=1)`` takes the plain path; with ``distributed_executor_backend="mp"``
it starts the ranks the way ``tensor_parallel_size=N`` does (``inferlab.parallel.launch``: a process group,
NCCL on CUDA and gloo on CPU, the sharded loader, the vocabulary-parallel embedding, the
all-reduce hooks and the ``ParallelRunner``) with a world of one. Greedy tokens must equal the
plain engine's. (A world of one skips the collectives themselves, as vLLM does.)

    python scripts/tp_check.py --device cuda     # on a GPU (gpu_check.sh runs it)
    python scripts/tp_check.py --device cpu      # the same check on CPU
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

from inferlab.llm import LLM
from inferlab.sampling import SamplingParams

PROMPTS = ["def fibonacci(n):\n    ", "import os\n", "class Stack:\n    def __init__(self):\n"]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="target")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--new-tokens", type=int, default=24)
    args = p.parse_args(argv)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # exact fp32 products in both engines
    knobs = dict(max_num_seqs=len(PROMPTS), num_kv_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)

    plain = LLM(args.model, device=args.device, dtype="float32", **knobs)
    want = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, params)]

    tp = LLM(args.model, device=args.device, dtype="float32", tensor_parallel_size=1,
             distributed_executor_backend="mp", **knobs)
    try:
        assert type(tp.llm_engine.runner).__name__ == "ParallelRunner", "the TP launch path was not taken"
        kinds = {type(m).__name__ for m in tp.model.modules()}
        assert {"RowParallelLinear", "VocabParallelEmbedding", "ParallelLMHead"} <= kinds, sorted(kinds)
        backend = dist.get_backend()  # the group the ranks joined: nccl on CUDA, gloo on CPU
        assert dist.get_world_size() == 1 and backend == ("nccl" if args.device.startswith("cuda") else "gloo"), backend
        got = [o.outputs[0].token_ids for o in tp.generate(PROMPTS, params)]
    finally:
        tp.shutdown()
    same = sum(a == b for a, b in zip(got, want))
    print(f"{args.model} on {args.device}: TP=1 through the launch path ({backend} group of 1, parallel layers); "
          f"greedy tokens equal the plain engine's for {same} of {len(PROMPTS)} prompts x {args.new_tokens} tokens")
    if same != len(PROMPTS):
        for a, b in zip(got, want):
            print("  TP=1:", a, "\n  plain:", b)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
