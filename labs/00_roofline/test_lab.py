"""Graded tests for lab 00. `inferlab grade labs/00_roofline` runs them against starter.py;
with --reference they run against inferlab.roofline, the reference solution."""
from hypothesis import given
from hypothesis import strategies as st

from inferlab import labkit
from inferlab import roofline as reference
from inferlab.roofline import PRESETS, Hardware

lab = labkit.implementation(__file__, reference="inferlab.roofline", functions=[
    "weight_bytes", "kv_bytes_per_token", "decode_step_bytes", "decode_step_flops",
    "decode_tokens_per_s", "arithmetic_intensity"])

H100 = PRESETS["H100 SXM"]
LLAMA2_7B_KV = 2 * 32 * 32 * 128 * 2  # 32 layers, 32 KV heads, head_dim 128, fp16

params = st.floats(min_value=1e6, max_value=1e12)
bits = st.sampled_from([2, 3, 4, 4.5, 5, 6, 8, 16, 32])
batches = st.integers(min_value=1, max_value=512)
contexts = st.integers(min_value=0, max_value=131_072)
hardware = st.sampled_from(sorted(PRESETS.values(), key=lambda h: h.name))


@labkit.points(2)
def test_weight_bytes_of_known_models():
    labkit.check(lab.weight_bytes, 70e9, 16, expected=140e9)  # the 70B x 2 bytes example
    labkit.check(lab.weight_bytes, 7e9, 4, expected=3.5e9)
    labkit.check(lab.weight_bytes, 8e9, 4.5, expected=4.5e9)  # 4-bit plus one fp16 scale per 32


@labkit.points(1)
@given(params, bits)
def test_weight_bytes_for_any_size(n, b):
    labkit.check(lab.weight_bytes, n, b, expected=reference.weight_bytes(n, b))


@labkit.points(2)
def test_kv_bytes_per_token_mha_and_gqa():
    labkit.check(lab.kv_bytes_per_token, 32, 32, 128, 2, expected=524_288)  # Llama-2-7B: 0.5 MiB
    labkit.check(lab.kv_bytes_per_token, 32, 8, 128, 2, expected=131_072)   # Llama-3-8B: GQA, 4x less
    labkit.check(lab.kv_bytes_per_token, 80, 8, 128, 1, expected=163_840)   # 70B with an fp8 cache


@labkit.points(1)
@given(st.integers(1, 128), st.integers(1, 64), st.sampled_from([64, 80, 96, 128, 256]),
       st.sampled_from([0.5, 1, 2, 4]))
def test_kv_bytes_per_token_for_any_shape(layers, heads, dim, nbytes):
    labkit.check(lab.kv_bytes_per_token, layers, heads, dim, nbytes,
                 expected=reference.kv_bytes_per_token(layers, heads, dim, nbytes))


@labkit.points(2)
def test_decode_step_bytes_adds_the_cache():
    labkit.check(lab.decode_step_bytes, 7e9, 16, expected=14e9)
    labkit.check(lab.decode_step_bytes, 7e9, 16, batch=8, context=4096, kv_token_bytes=LLAMA2_7B_KV,
                 expected=14e9 + 8 * 4096 * LLAMA2_7B_KV)


@labkit.points(1)
@given(params, bits, batches, contexts)
def test_decode_step_bytes_grows_with_batch_and_context(n, b, batch, context):
    got = labkit.check(lab.decode_step_bytes, n, b, batch, context, LLAMA2_7B_KV,
                       expected=reference.decode_step_bytes(n, b, batch, context, LLAMA2_7B_KV))
    more = lab.decode_step_bytes(n, b, batch + 1, context + 1, LLAMA2_7B_KV)
    labkit.expect(more > got, "one more sequence and one more token of context must read more bytes",
                  num_params=n, bits=b, batch=batch, context=context)


@labkit.points(1)
def test_decode_step_flops():
    labkit.check(lab.decode_step_flops, 7e9, expected=14e9)
    labkit.check(lab.decode_step_flops, 7e9, batch=64, expected=64 * 14e9)


@labkit.points(3)
def test_seventy_billion_on_an_h100_is_memory_bound():
    # 140 GB per step at 3.35 TB/s: about 24 tokens/s, whatever the compute could do
    labkit.check(lab.decode_tokens_per_s, H100, 70e9, 16,
                 expected={"tokens_per_s": 3.35e12 / 140e9, "bound": "memory"})


@labkit.points(2)
def test_a_large_batch_becomes_compute_bound():
    compute_s = 2 * 7e9 * 1024 / H100.peak_flops  # 14.5 ms of math vs 4.2 ms of weight reads
    labkit.check(lab.decode_tokens_per_s, H100, 7e9, 16, batch=1024,
                 expected={"tokens_per_s": 1024 / compute_s, "bound": "compute"})


@labkit.points(2)
@given(hardware, params, bits, batches, contexts)
def test_decode_ceiling_for_any_setting(hw, n, b, batch, context):
    expected = reference.decode_tokens_per_s(hw, n, b, batch, context, LLAMA2_7B_KV)
    labkit.check(lab.decode_tokens_per_s, hw, n, b, batch, context, LLAMA2_7B_KV,
                 expected=expected, keys=["tokens_per_s", "bound"])


@labkit.points(1)
def test_arithmetic_intensity_of_decode_and_prefill():
    labkit.check(lab.arithmetic_intensity, 7e9, 16, 1, expected=1.0)     # fp16 decode: 1 FLOP/byte
    labkit.check(lab.arithmetic_intensity, 7e9, 4, 1, expected=4.0)      # int4 reads 4x fewer bytes
    labkit.check(lab.arithmetic_intensity, 7e9, 16, 2048, expected=2048.0)  # a 2048-token prompt
    ridge = Hardware("x", 989e12, 3.35e12, 80e9).ridge_point
    labkit.expect(lab.arithmetic_intensity(7e9, 16, 2048) > ridge > lab.arithmetic_intensity(7e9, 16, 1),
                  "prefill must sit right of the H100's ridge point and decode left of it", ridge=ridge)
