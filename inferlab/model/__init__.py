"""The model and how it is loaded: the Llama-family decoder (``llama``), its parts (``rope``,
``moe``, ``packing``, ``linear``, ``gqa``), its configuration, the tokenizer and chat template,
and the loaders for HF folders (``loader``) and GGUF files (``gguf_loader``).

The engine above this package sees a model only through ``CausalLM.forward``."""
from inferlab.model.llama import CausalLM

__all__ = ["CausalLM"]
