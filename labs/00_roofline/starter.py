"""Lab 00: why decoding is memory-bound. Write the six functions below.

Every decode step reads all the weights (and each sequence's cached keys and values) from
memory to produce one token per sequence, and does about 2 FLOPs per weight per sequence.
The roofline model says a step takes at least the longer of the two times:

    memory time  = bytes read    / memory bandwidth
    compute time = FLOPs done    / peak FLOP/s

Grade your work with `inferlab grade labs/00_roofline`. Keep the names and signatures.
"""
from inferlab.roofline import Hardware  # name, peak_flops (FLOP/s), mem_bandwidth (bytes/s), memory_bytes


def weight_bytes(num_params: float, bits_per_param: float) -> float:
    """Bytes needed to store ``num_params`` weights of ``bits_per_param`` bits each.

    A 70e9-parameter model in fp16 (16 bits) needs 140e9 bytes.
    """
    raise NotImplementedError("about 1 line")


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                       bytes_per_elem: float = 2) -> float:
    """Bytes one token adds to the KV cache: a key AND a value vector of ``head_dim`` numbers
    for every key/value head in every layer."""
    raise NotImplementedError("about 1 line")


def decode_step_bytes(num_params: float, bits_per_param: float, batch: int = 1,
                      context: int = 0, kv_token_bytes: float = 0.0) -> float:
    """Bytes one decode step reads: every weight once (shared by the whole batch), plus, for
    each of the ``batch`` sequences, the cached K/V of its ``context`` previous tokens."""
    raise NotImplementedError("about 1 line: reuse weight_bytes")


def decode_step_flops(num_params: float, batch: int = 1) -> float:
    """FLOPs of one decode step: a multiply and an add per weight, for each sequence."""
    raise NotImplementedError("about 1 line")


def decode_tokens_per_s(hw: Hardware, num_params: float, bits_per_param: float, batch: int = 1,
                        context: int = 0, kv_token_bytes: float = 0.0) -> dict:
    """The roofline ceiling for decoding on ``hw``.

    Returns {"tokens_per_s": tokens per second summed over the batch,
             "bound": "memory" or "compute" (whichever time is longer; "memory" on a tie)}.
    """
    raise NotImplementedError("about 5 lines: two times, the longer one wins")


def arithmetic_intensity(num_params: float, bits_per_param: float, tokens_per_weight_read: int) -> float:
    """FLOPs per byte of weights read when ``tokens_per_weight_read`` tokens share one pass over
    the weights (1 in single-stream decode, the batch size in batched decode, the prompt
    length in prefill)."""
    raise NotImplementedError("about 1 line: reuse two functions above")
