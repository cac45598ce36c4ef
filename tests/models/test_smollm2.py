"""The course's real model, SmolLM2-135M-Instruct from its GGUF, against references nobody here
wrote: transformers' own GGUF loading (logits, greedy tokens, tokenizer) and llama.cpp on the same
file (tokenizer, perplexity on the same windows)."""
import math

import pytest
import torch

from inferlab import LLM, SamplingParams
from inferlab.eval import ppl as ppl_eval
from inferlab.quant.ggml import GGMLLinear

pytestmark = pytest.mark.slow

PROMPTS = ["def fibonacci(n):",
           "<|im_start|>user\nHow do I reset my password?<|im_end|>\n<|im_start|>assistant\n",
           "The capital of France is"]
STRINGS = ["Hello world", "  leading spaces\tand\ttabs\n\n\nnewlines", "1234567 + 89 = 1234656, 3.14159",
           "def fib(n):\n    return n if n < 2 else fib(n-1) + fib(n-2)\n", "Ünïcödé — 日本語テキスト 🤗🚀 naïve café",
           "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "it's we're I'll they'd", "    \n   x   ",
           "<|endoftext|>abc<repo_name>", "price: $1,000.00!!! 2024-12-01", "a\u00a0b\u2003c", "\r\n\r\n  \t"]


def llama_cpp_runner():
    pytest.importorskip("llama_cpp")
    from inferlab.quant import llama_cpp_runner
    return llama_cpp_runner


def test_config_and_layout(smollm2_stored):
    model, tok = smollm2_stored
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size) == (30, 576, 1536)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.vocab_size) == (9, 3, 64, 49152)
    assert c.rope_theta == 1e5 and c.tie_word_embeddings and tok.eos_token_ids == (2,) and tok.bos_token_id == 1
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q, GGMLLinear) and q.ggml_type == "q4_1"  # blocks as stored
    assert tok.chat_template is not None and "<|im_start|>" in tok.chat_template.source
    head = model.lm_head  # the tied Q8_0 token embedding, run as stored; the lookup table in fp32
    assert isinstance(head, GGMLLinear) and head.ggml_type == "q8_0"
    assert torch.equal(head.dequantize(), model.model.embed_tokens.weight)


def test_logits_match_transformers(smollm2_fp32, smollm2_transformers):
    ours, tok = smollm2_fp32
    hf, _ = smollm2_transformers
    for prompt in PROMPTS[:2]:
        ids = torch.tensor([tok.encode(prompt)])
        with torch.no_grad():
            a, b = ours(ids), hf(ids).logits
        # relative to the logits' scale (about 20 here): fp32 sums over 30 layers in another order
        # (AVX-512 or AVX2 loops, MKL) differ by a few parts in a million, a real bug by far more
        diff, scale = (a - b).abs().max().item(), b.abs().max().item()
        assert diff <= 1e-5 * scale, f"{prompt!r}: max |logit difference| {diff:.2e} (logits up to {scale:.1f})"


def test_greedy_tokens_match_transformers(smollm2_fp32, smollm2_transformers):
    model, tok = smollm2_fp32
    hf, _ = smollm2_transformers
    llm = LLM.from_model(model, tok)
    prompts = [tok.encode(p) for p in PROMPTS]
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(temperature=0, max_tokens=20))
    for ids, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False, eos_token_id=2,
                              pad_token_id=2)[0, len(ids):].tolist()
        assert out.outputs[0].token_ids == ref, tok.decode(ids)


def test_token_ids_match_transformers_and_llama_cpp(smollm2_file, smollm2_stored, smollm2_transformers):
    _, tok = smollm2_stored
    _, hf_tok = smollm2_transformers
    ours = [tok.encode(s) for s in STRINGS]
    assert ours == [hf_tok(s)["input_ids"] for s in STRINGS]
    assert all(tok.decode(ids, skip_special_tokens=False) == s for ids, s in zip(ours, STRINGS))
    assert ours[5][0] == 1 and ours[5].count(2) == 1  # <|im_start|>, <|im_end|> stay whole
    assert ours == llama_cpp_runner().tokenize(smollm2_file, STRINGS)


def test_perplexity_matches_llama_cpp_on_the_same_windows(smollm2_file, smollm2_stored, smollm2_fp32):
    """As stored (Q4_1 blocks, activations rounded to 8 bits per block of 32 in the decode loop, exact
    floats in prefill) against llama.cpp's CPU run of the same file: within 1%."""
    runner = llama_cpp_runner()
    model, tok = smollm2_stored
    ids = ppl_eval.test_stream(tok)[: 4 * 511 + 1]
    windows = ppl_eval.windows(len(ids), 512, 512)
    spans = [ids[b:e].tolist() for b, e, _ in windows]
    ours = ppl_eval.evaluate(model, ids, window=512, stride=512, reference=smollm2_fp32[0])
    theirs = runner.score_windows(smollm2_file, ids, windows)
    assert theirs["tokens"] == ours["tokens"]
    ppl_cpp = math.exp(theirs["nll"])
    argmax = torch.tensor([a for span in theirs["argmax"] for a in span])
    with torch.no_grad():
        mine = torch.cat([model(torch.tensor([s]))[0, :-1].argmax(-1) for s in spans])
    agreement = (argmax == mine).float().mean().item()
    print(f"smollm2 ppl: inferlab as stored {ours['ppl']:.3f}, llama.cpp {ppl_cpp:.3f}; greedy agreement with "
          f"llama.cpp {agreement:.3f}, with inferlab fp32 {ours['agreement']:.3f}")
    assert abs(ours["ppl"] / ppl_cpp - 1) < 0.01, f"inferlab {ours['ppl']:.3f} vs llama.cpp {ppl_cpp:.3f}"
    assert agreement > 0.9


def test_quantize_to_gguf_round_trips(tmp_path, smollm2_file, smollm2_stored, smollm2_fp32):
    """`inferlab quantize --format gguf` on the real model: the file loads back block for block, with
    its tokenizer (pre-tokenizer `smollm`) and chat template, and llama.cpp runs it."""
    from inferlab import cli
    from inferlab.model.loader import load_checkpoint
    from inferlab.quant.ggml import quantize_q8_0

    assert cli.main(["quantize", "--model", "smollm2", "--method", "q8_0", "--format", "gguf",
                     "--out", str(tmp_path / "q8")]) == 0
    path = tmp_path / "q8" / "model.gguf"
    model, tok = load_checkpoint(path, device="cpu")
    _, original = smollm2_stored
    assert [tok.encode(s) for s in STRINGS] == [original.encode(s) for s in STRINGS]
    assert tok.chat_template.source == original.chat_template.source
    q = model.model.layers[2].self_attn.k_proj
    assert q.ggml_type == "q8_0"
    assert torch.equal(q.qweight, quantize_q8_0(smollm2_fp32[0].model.layers[2].self_attn.k_proj.weight))
    ids = ppl_eval.test_stream(tok)[:1023]
    ours = ppl_eval.evaluate(model, ids, window=512)
    theirs = math.exp(llama_cpp_runner().score_windows(path, ids, ppl_eval.windows(len(ids), 512, 256))["nll"])
    assert abs(ours["ppl"] / theirs - 1) < 0.01, f"inferlab {ours['ppl']:.3f} vs llama.cpp {theirs:.3f}"


def test_chat_renders_as_transformers_and_stops_at_the_end_of_turn(smollm2_stored, smollm2_transformers):
    model, tok = smollm2_stored
    _, hf_tok = smollm2_transformers
    # a question whose greedy answer ends within the budget on every kernel path (int8 activations
    # in the VNNI loops, floats elsewhere): a longer open question can run past max_tokens on one
    messages = [{"role": "user", "content": "How do I reset my password? Answer in one short sentence."}]
    expected = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tok.chat_template.render(messages) == expected  # the default system prompt included
    llm = LLM.from_model(model, tok)
    (out,) = llm.chat(messages, SamplingParams(temperature=0, max_tokens=200))
    assert out.prompt_token_ids == hf_tok(expected, add_special_tokens=False)["input_ids"]
    reply = out.outputs[0]
    assert reply.finish_reason == "stop" and reply.token_ids[-1] == 2  # <|im_end|>
    assert "<|im_end|>" not in reply.text and "password" in reply.text.lower()


def test_bench_decode_times_the_file_as_stored_beside_llama_cpp(capsys):
    """`bench decode --model smollm2 --precisions stored,fp32`: the Q4_1 linears and the Q8_0 head read
    92 MiB a token, fp32 513 MiB; llama.cpp times the very file (a smoke test: speed is for the bench)."""
    import json

    from inferlab import cli
    assert cli.main(["bench", "decode", "--model", "smollm2", "--precisions", "stored,fp32", "--eager-only",
                     "--new-tokens", "4", "--repeats", "1", "--json"]) == 0
    rows = {r["precision"]: r for r in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]}
    assert 88 < rows["stored"]["weight_mb"] < 96 and 505 < rows["fp32"]["weight_mb"] < 520  # MiB
    assert rows["stored"]["engine_tokens_per_s"] > 0 and "transformers_tokens_per_s" in rows["fp32"]
    import importlib.util
    assert ("llama.cpp_tokens_per_s" in rows["stored"]) == (importlib.util.find_spec("llama_cpp") is not None)


def test_models_lists_smollm2_with_its_card(capsys, smollm2_file, smollm2_fp32):
    import json

    from inferlab import cli
    assert cli.main(["models", "--json"]) == 0
    entry = next(m for m in json.loads(capsys.readouterr().out) if m["name"] == "smollm2")
    assert entry["path"] == str(smollm2_file) and entry["file_bytes"] == smollm2_file.stat().st_size
    assert entry["params"] == smollm2_fp32[0].num_parameters() and entry["license"] == "apache-2.0"
    proto = entry["ppl_protocol"]
    assert (proto["split"], proto["window"], proto["stride"]) == ("test", 512, 256)
    # measured by scripts/model_card.py: llama.cpp within 1% of inferlab on the same windows
    assert abs(entry["ppl_llama_cpp"] / entry["ppl_as_stored"] - 1) < 0.01
    assert cli.main(["models"]) == 0 and f"perplexity {entry['ppl_as_stored']:.3f} as stored" in capsys.readouterr().out
