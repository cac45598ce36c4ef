"""LLM(attention_backend="triton"): the engine on the Triton kernels gives the torch backend's
greedy tokens (paged decode, prefill, chunked prefill over cached blocks, a Mistral window that
falls back to torch), on tiny transformers-saved models and on the embedded target."""
from __future__ import annotations

import pytest
import torch

from inferlab import LLM, SamplingParams
from inferlab.attention import TritonBackend, get_backend
from inferlab.generate import generate
from inferlab.model.loader import load_checkpoint
from tests.core.checkpoints import VOCAB, save_variant
from tests.kernels.conftest import DEVICE

# fp32 everywhere: the comparison is between kernels, not between precisions
# (on a GPU, scripts/gpu_check.sh sets TRITON_F32_DEFAULT=ieee so fp32 dots are not TF32)
DTYPE = "float32"
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
IDS = [[5, 17, 33, 2 + 7, 41], [9] * 3 + list(range(20, 28)), [77]]  # 5, 11 and 1 prompt tokens


@pytest.fixture(scope="module", params=["llama_gqa", "llama_mqa", "mistral_window8"])
def tiny(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    save_variant(request.param, folder)
    return folder


@pytest.fixture
def calls(monkeypatch):
    """Counts the kernel launches the backend makes (it binds the kernels when it is built)."""
    import inferlab.kernels.flash_attention as fa
    import inferlab.kernels.paged_attention as pa

    counts = {"flash_attention": 0, "paged_attention": 0}
    for module, name in ((fa, "flash_attention"), (pa, "paged_attention")):
        def counted(*args, _fn=getattr(module, name), _name=name, **kwargs):
            counts[_name] += 1
            return _fn(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)
    return counts


def tokens(model, backend, ids=IDS, params=GREEDY, **knobs):
    llm = LLM(model=str(model), attention_backend=backend, device=DEVICE, dtype=DTYPE, **knobs)
    return [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=ids, sampling_params=params)]


def test_the_backend_is_registered():
    assert isinstance(get_backend("triton"), TritonBackend)


def test_greedy_tokens_equal_torch(tiny, calls):
    # block_size 4: every sequence spans several blocks; the window of 8 bites past 8 tokens
    assert tokens(tiny, "triton", block_size=4) == tokens(tiny, "torch", block_size=4)
    layers = 2
    if "window" in tiny.name:  # the 11-token prompt and the later decodes see past the window: torch
        assert calls["flash_attention"] >= layers  # the 5-token prompt
    else:
        assert calls["flash_attention"] >= layers * 2  # the two prompts longer than one token
        assert calls["paged_attention"] >= layers * GREEDY.max_tokens // 2  # the batched decodes


def test_chunked_prefill_and_prefix_hits(tmp_path, calls):
    save_variant("llama_gqa", tmp_path)
    shared = list(range(30, 50))
    ids = [shared + [3, 4], shared + [5], list(range(60, 75))]
    knobs = dict(block_size=4, enable_prefix_caching=True, enable_chunked_prefill=True, max_num_batched_tokens=8,
                 max_num_seqs=4)
    assert tokens(tmp_path, "triton", ids, **knobs) == tokens(tmp_path, "torch", ids, **knobs)
    assert calls["flash_attention"] > 0 and calls["paged_attention"] > 0


def test_contiguous_cache_path(tmp_path):
    """inferlab.generate's contiguous cache: kernels where no mask is needed, torch with left padding."""
    save_variant("llama_gqa", tmp_path)
    model, _ = load_checkpoint(tmp_path, device=DEVICE, dtype=torch.float32)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10]]  # two lengths: left padding in the batch
    params = [GREEDY] * 2
    want = [s.output_token_ids for s in generate(model, prompts, params)]
    model.set_attention_backend(TritonBackend())
    assert [s.output_token_ids for s in generate(model, prompts, params)] == want
    assert [s.output_token_ids for s in generate(model, prompts[:1], params[:1])] == want[:1]
    assert max(max(p) for p in prompts) < VOCAB


@pytest.mark.slow
def test_embedded_target():
    prompts = [[t for t in range(100, 112)], [500, 501, 502]]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    assert tokens("target", "triton", prompts, params) == tokens("target", "torch", prompts, params)


def test_speculative_verify_rows_run_on_the_kernel(tmp_path, monkeypatch):
    """n-gram speculation: each verify's k + 1 query rows go through one paged_attention launch
    (a row per query, causal by context length) and the tokens stay the torch backend's."""
    save_variant("llama_gqa", tmp_path)
    seen = []
    original = TritonBackend._multi_query

    def spy(self, q, layer_idx, meta):
        out = original(self, q, layer_idx, meta)
        seen.append(q.shape[1])
        want = __import__("inferlab.attention.paged", fromlist=["torch_multi_query"]).torch_multi_query(q, layer_idx, meta)
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        return out
    monkeypatch.setattr(TritonBackend, "_multi_query", spy)
    ids = [[5, 6, 7, 8] * 4, [9, 10, 11] * 5 + [9]]  # repeats: prompt lookup finds guesses
    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = tokens(tmp_path, "torch", ids, params, block_size=4)
    assert tokens(tmp_path, "triton", ids, params, block_size=4, speculative_config=spec) == want
    assert seen and max(seen) >= 3  # some step verified guesses with several query rows
