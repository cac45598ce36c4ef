"""inferlab: a small, readable LLM inference engine, taught by building it.

    from inferlab import LLM, SamplingParams
    llm = LLM(model="target")
    out = llm.generate(["def fibonacci(n):"], SamplingParams(temperature=0, max_tokens=64))
    print(out[0].outputs[0].text)
"""
from inferlab.llm import LLM
from inferlab.outputs import CompletionOutput, RequestOutput
from inferlab.sampling import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"
