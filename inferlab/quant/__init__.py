"""Weight quantization behind the linear seam: INT8, INT4 group-wise, GPTQ, AWQ, NF4 and llama.cpp blocks.

    from inferlab.quant import quantize_model, save_quantized
    config = quantize_model(model, "gptq", bits=4, group_size=128, tokenizer=tok)   # in place
    save_quantized(model, tok, "target-gptq", config)        # LLM(model="target-gptq") loads it

Modules: ``int8`` / ``int4`` / ``nf4`` / ``ggml`` hold the packed formats (each a ``QuantLinear``
with ``dequantize()``); ``gptq`` and ``awq`` are the calibrated methods; ``hub`` converts the
GPTQ/AWQ hub layouts; ``checkpoint`` writes and reads quantized folders; ``gguf_export`` writes a
.gguf file that llama.cpp runs.
"""
from inferlab.quant import fused
from inferlab.quant.base import QuantizationError, QuantLinear
from inferlab.quant.checkpoint import save_quantized
from inferlab.quant.ggml import GGMLLinear
from inferlab.quant.int4 import Int4Linear, dequantize_int4, pack_int4, quantize_int4, unpack_int4
from inferlab.quant.int8 import Int8Linear
from inferlab.quant.methods import METHODS
from inferlab.quant.nf4 import NF4Linear
from inferlab.quant.quantize import linear_weight_bytes, quantize_model

__all__ = ["METHODS", "GGMLLinear", "Int4Linear", "Int8Linear", "NF4Linear", "QuantLinear", "QuantizationError",
           "dequantize_int4", "fused", "linear_weight_bytes", "pack_int4", "quantize_int4", "quantize_model",
           "save_quantized", "unpack_int4"]
