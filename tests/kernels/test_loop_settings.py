"""The loop settings (inferlab.loop_settings.settings): a model's forward reads the environment once and
keeps that reading for the whole pass; outside a forward every call sees the environment as it is."""
import pytest
import torch

from inferlab import loop_settings
from inferlab.model.config import ModelConfig
from inferlab.model.llama import CausalLM


def _model(layers=3):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    return CausalLM(cfg).eval()


def test_outside_a_forward_the_environment_is_read_at_each_call(monkeypatch):
    monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "Eager")
    assert loop_settings.settings().kernel == "eager"
    monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "auto")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "AVX2")
    monkeypatch.setenv("INFERLAB_VNNI_BUILD", "portable")
    assert loop_settings.settings() == loop_settings.Settings("auto", "avx2", "portable")


def test_a_forward_reads_the_environment_once(monkeypatch):
    reads = []
    real = loop_settings._read
    monkeypatch.setattr(loop_settings, "_read", lambda: reads.append(1) or real())
    model = _model()
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))
        assert len(reads) == 1  # not once per projection, norm and attention call
        model(torch.tensor([[4]]))
    assert len(reads) == 2
    assert loop_settings._held is None  # released after the pass


def test_a_setting_changed_during_a_forward_holds_from_the_next_one(monkeypatch):
    model = _model()
    seen = []
    monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "auto")

    def first(*_):
        monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "eager")
        seen.append(loop_settings.settings().kernel)
    model.model.layers[0].register_forward_hook(first)
    model.model.layers[-1].register_forward_hook(lambda *_: seen.append(loop_settings.settings().kernel))
    with torch.no_grad():
        model(torch.tensor([[1, 2]]))
    assert seen == ["auto", "auto"]  # the whole pass keeps its first reading
    assert loop_settings.settings().kernel == "eager"  # the next call sees the change


def test_held_nests_and_is_released_by_an_error(monkeypatch):
    monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "auto")
    with pytest.raises(RuntimeError):
        with loop_settings.held():
            monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "compiled")
            with loop_settings.held():  # a draft's forward inside its target's step keeps the outer reading
                assert loop_settings.settings().kernel == "auto"
            assert loop_settings.settings().kernel == "auto"
            raise RuntimeError("a forward that fails")
    assert loop_settings._held is None
    assert loop_settings.settings().kernel == "compiled"


def test_a_function_is_marked_constant_as_torch_marks_it():
    def ours():
        return 1

    def torchs():
        return 1
    assert loop_settings.constant_in_graphs(ours) is ours
    torch.compiler.assume_constant_result(torchs)
    assert vars(torchs) and vars(ours) == vars(torchs)


def test_a_compiled_graph_calls_a_marked_function_once_while_tracing():
    calls = []

    def which_loop():
        calls.append(1)
        return 2.0
    marked = loop_settings.constant_in_graphs(which_loop)
    f = torch.compile(lambda x: x * marked(), backend="eager", fullgraph=True)
    x = torch.ones(3)
    assert f(x).tolist() == [2.0] * 3 and f(x).tolist() == [2.0] * 3
    assert len(calls) == 1, "traced into: the graph replays the function's side effects at every call"


def test_loading_a_model_and_generating_never_imports_dynamo():
    """torch._dynamo takes a second to import: the CLI, a notebook kernel and every test process
    that loads a model pay it only when they compile."""
    import subprocess
    import sys
    code = ("import sys\nfrom inferlab import cli\nfrom inferlab.llm import LLM\nfrom inferlab.sampling import SamplingParams\n"
            "LLM(model='target', device='cpu').generate(['def f('], SamplingParams(temperature=0, max_tokens=2))\n"
            "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
