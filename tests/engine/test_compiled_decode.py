"""enforce_eager=False: pure-decode steps run a torch.compile'd forward (one graph per batch size).

The compiled step must give the eager engine's greedy tokens exactly (same ops, fused), over a
ragged batch whose sequences finish at different steps (the batch shrinks, contexts differ, so
the decode mask is used), and must really have run (its batch sizes are recorded). Slow: the
first compile takes tens of seconds on a CPU."""
import pytest
import torch

from inferlab import LLM, SamplingParams
from inferlab.engine.model_runner import ModelRunner

PROMPTS = ["def fibonacci(n):\n", "import os\nimport sys\nclass Node:\n    def __init__(self", "x = ["]


@pytest.mark.slow
def test_compiled_decode_gives_the_eager_tokens():
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (12, 20, 6)]
    eager = LLM(model="target", device="cpu")
    want = [o.outputs[0].token_ids for o in eager.generate(PROMPTS, params)]
    llm = LLM(model="target", device="cpu", enforce_eager=False)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    assert got == want
    assert llm.llm_engine.runner.compiled_batch_sizes >= {3, 2, 1}  # every decode step ran compiled
    assert eager.llm_engine.runner.compiled is None  # the default stays eager


@pytest.mark.slow
def test_a_quantized_model_compiles_its_decode_step_too():
    """INT4's decode products join the graph (the VNNI loop as a custom op, or inductor's expression
    where the CPU has no VNNI): the same tokens as the eager quantized engine, run compiled."""
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (10, 6)]
    eager = LLM(model="target", device="cpu", quantization="int4")
    want = [o.outputs[0].token_ids for o in eager.generate(PROMPTS[:2], params)]
    llm = LLM(model="target", device="cpu", quantization="int4", enforce_eager=False)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], params)]
    assert got == want
    assert llm.llm_engine.runner.compiled_batch_sizes >= {2, 1}


def test_a_hooked_projection_keeps_the_step_eager():
    """A forward hook (calibration, a probe) must see its calls: the runner then runs eagerly."""
    llm = LLM(model="target", device="cpu")
    runner = ModelRunner(llm.model, llm.llm_engine.kv_cache, compile_decode=True)
    runner.compiled = lambda *a, **k: pytest.fail("compiled forward called while a hook watches")
    seen = []
    handle = llm.model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda m, i, o: seen.append(1))
    try:
        llm.llm_engine.runner = runner
        llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    finally:
        handle.remove()
    assert len(seen) == 3  # the prompt and two decode steps, all eager


def test_a_failed_compile_falls_back_to_eager_once(caplog):
    """No C++ compiler (or an op inductor cannot lower): the step runs eagerly and says so once."""
    from torch._dynamo.exc import TorchDynamoException
    llm = LLM(model="target", device="cpu")
    want = llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    runner = llm.llm_engine.runner

    def broken(*a, **k):
        raise TorchDynamoException("no C++ compiler found")
    runner.compiled = broken
    got = llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert runner.compiled is None and runner.compiled_batch_sizes == set()
    assert sum("runs eagerly" in r.message for r in caplog.records) == 1
