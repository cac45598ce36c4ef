"""The serving engine, in nano-vllm's layout: the KV block allocator (``block_manager``) first."""
from inferlab.engine.block_manager import BlockManager, NoFreeBlocksError

__all__ = ["BlockManager", "NoFreeBlocksError"]
