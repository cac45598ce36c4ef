"""The serving engine, in nano-vllm's layout.

    llm_engine.py     LLMEngine: add_request, step, abort_request, kv_cache_stats
    scheduler.py      waiting / running queues (fcfs or priority order), token budget, preemption
                      (policy.py: continuous, static)
    sched_output.py   SchedulerOutput: what one step runs (shared by scheduler.py and policy.py)
    block_manager.py  the KV block allocator: block tables, ref counts, prefix caching, copy-on-write
    model_runner.py   one forward over a ragged batch (slot_mapping, block_tables)
    request.py        per-request and per-sequence state;  config.py  the knobs
"""
from inferlab.engine.block_manager import BlockManager, NoFreeBlocksError
from inferlab.engine.config import EngineConfig
from inferlab.engine.llm_engine import LLMEngine

__all__ = ["BlockManager", "NoFreeBlocksError", "EngineConfig", "LLMEngine"]
