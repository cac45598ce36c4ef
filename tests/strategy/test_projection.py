"""The projection's arithmetic against hand-computed cases and notebook 00's roofline."""
import pytest

from inferlab import roofline
from inferlab.strategy import projection as P

H100 = roofline.PRESETS["H100 SXM"]


def test_littles_law():
    r = P.littles_law(86_400, 2.0, ttft_s=1.0, output_tokens=100, tpot_s=0.05)
    assert r["peak_rate"] == pytest.approx(2.0) and r["time_in_system_s"] == pytest.approx(6.0)
    assert r["concurrency"] == pytest.approx(12.0)


def test_step_matches_the_roofline_module():
    kv = P.llama_kv_token()
    assert kv == 2 * 32 * 8 * 128 * 2
    for batch in (1, 64, 512):
        ours = P.step_seconds(H100, 8e9, 16, batch, 1024, kv)
        ref = roofline.decode_tokens_per_s(H100, 8e9, 16, batch, 1024, kv)
        assert batch / ours == pytest.approx(ref["tokens_per_s"])
    assert 1 / P.step_seconds(H100, 8e9, 16, 1, 0, 0) == pytest.approx(3.35e12 / 16e9)   # ~209 tok/s


def test_max_batch_respects_tpot_and_memory():
    kv = P.llama_kv_token()
    b = P.max_batch(H100, 8e9, 16, 1024, kv, tpot_s=0.02)
    assert P.step_seconds(H100, 8e9, 16, b, 1024, kv) <= 0.02 < P.step_seconds(H100, 8e9, 16, b + 1, 1024, kv) \
        or (b + 1) * 1024 * kv > 0.9 * 80e9 - 16e9
    assert P.max_batch(H100, 70e9, 16, 1024, kv, tpot_s=1.0) == 0          # 140 GB of weights do not fit in 80 GB
    assert P.max_batch(H100, 8e9, 4.25, 1024, kv, 0.02) > b                 # fewer weight bytes: more sequences


def test_gpus_needed():
    assert P.gpus_needed(100, 40, 0.0) == 3 and P.gpus_needed(100, 40, 0.5) == 5
    assert P.gpus_needed(1, 40, 0.0) == 1 and P.gpus_needed(10, 0, 0.0) == 0
    assert P.prefill_share(H100, 8e9, 10, 500, efficiency=1.0) == pytest.approx(10 * 500 * 16e9 / 989e12)
