"""``inferlab bench rows``: the cost of more rows per format, from memory and from the cache."""
from __future__ import annotations

import torch

from inferlab.bench import rows as bench_rows
from inferlab.model.decode_layers import LinearsCall


def test_rows_table_times_memory_and_cache_passes(monkeypatch):
    """Every format and row count gets a ratio to one row, from memory and in cache; a format with
    loops runs them in one C call per pass, the in-cache pass over layer 0's projections only, as many
    times as the whole model has projections; F.linear runs its modules."""
    passes = []
    real_of = LinearsCall.of

    def recorded(modules):
        passes.append(list(modules))
        return real_of(modules)

    monkeypatch.setattr(LinearsCall, "of", staticmethod(recorded))
    layers = bench_rows.layer_linears("target", "fp32")
    res = bench_rows.run("target", formats=("fp32", "fp32-torch", "q8_0"), rows=(1, 5), repeats=1)
    for f in ("fp32", "q8_0"):
        r = res["formats"][f]
        assert set(r["vs_one_row"]) == set(r["in_cache"]["vs_one_row"]) == {"1", "5"}
        assert r["vs_one_row"]["1"] == r["in_cache"]["vs_one_row"]["1"] == 1.0
        assert r["goal_5_rows"]["floor"] > 0 and r["in_cache"]["one_row_ms"] > 0
        assert r["timed"] == "C loops, one call a pass"
    assert res["formats"]["fp32-torch"]["timed"] == "module calls"
    n = res["formats"]["fp32"]["linears"]
    assert n == sum(len(layer) for layer in layers)
    # as a decode step runs them: q|k|v and gate|up packed (4 products a layer), in every format timed
    from inferlab.model.loader import load_checkpoint
    layer0 = load_checkpoint("target", device="cpu")[0].model.layers[0]
    a, mlp = layer0.self_attn, layer0.mlp
    widths = [a.q_proj.out_features + a.k_proj.out_features + a.v_proj.out_features, a.o_proj.out_features,
              mlp.gate_proj.out_features + mlp.up_proj.out_features, mlp.down_proj.out_features]
    for f in ("fp32", "fp32-torch", "q8_0", "nf4"):
        per_layer = layers if f == "fp32" else bench_rows.layer_linears("target", f)
        assert [len(layer) for layer in per_layer] == [4] * len(per_layer), f
        assert [m.out_features for m in per_layer[0]] == widths, f
    # fp32 and q8_0, a memory pass (every layer) and a cache pass (layer 0's projections, n of them)
    assert len(passes) == 4 and all(len(p) == n for p in passes)
    assert [len({id(m) for m in p}) for p in passes] == [n, len(layers[0]), n, len(layers[0])]
    assert set(res["formats"]["fp32"]["vs_torch"]) == {"1", "5"}
    assert "floor" in bench_rows.table(res)
    from inferlab.quant import vnni
    if vnni.peak_int8_macs(1, seconds=0.01) is not None:  # the x86 builds: q8_0's loops run the roof's instruction
        assert res["roof"]["macs_per_row"] == sum(m.in_features * m.out_features for layer in layers for m in layer)
        assert res["formats"]["q8_0"]["goal_5_rows"]["roof"] > 0 and "roof" not in res["formats"]["fp32"]["goal_5_rows"]
        assert "GMAC/s" in bench_rows.table(res)


def test_one_c_call_runs_the_modules_products():
    """LinearsCall runs each module's own loop over the first M x K values of x, one after the other:
    y ends as the last module's product (a wrong pointer, width or signature shows here)."""
    torch.manual_seed(0)
    for fmt in ("fp32", "q8_0", "int8"):
        (layer, *_) = bench_rows.layer_linears("target", fmt)
        call = LinearsCall.of(layer)
        assert call is not None, fmt
        x, y = torch.randn(3, max(m.in_features for m in layer)), torch.zeros(3, 4096)
        for m in layer:  # each module alone: the call's y ends as its product
            one = LinearsCall.of([m])
            one(x, y)
            k, n = m.in_features, m.out_features
            with torch.inference_mode():
                want = m(x.flatten()[:3 * k].view(3, k))
            torch.testing.assert_close(y.flatten()[:3 * n].view(3, n), want, rtol=1e-5, atol=1e-5)
        call(x, y)
        last = layer[-1]
        with torch.inference_mode():
            want = last(x.flatten()[:3 * last.in_features].view(3, last.in_features))
        torch.testing.assert_close(y.flatten()[:3 * last.out_features].view(3, -1), want, rtol=1e-5, atol=1e-5)


def test_each_pass_from_memory_starts_with_the_cache_emptied(monkeypatch):
    """The cache keeps part of a pass for the next passes over the same weights, more the more
    passes in a row: the row count timed first after another format's passes read its weights
    colder than the rest. So every pass from memory follows a read of a buffer larger than the
    cache, and every pass in cache follows an untimed pass over the same weights."""
    seen = []
    real_call = LinearsCall.__call__

    def recorded(self, x, y):
        seen.append((id(self), x.shape[0]))
        return real_call(self, x, y)

    monkeypatch.setattr(LinearsCall, "__call__", recorded)
    monkeypatch.setattr(bench_rows, "evict", lambda buffer: seen.append(("evict", buffer.numel() * 4)))
    bench_rows.run("target", formats=("fp32", "q8_0"), rows=(1, 5), repeats=1)
    # 2 formats x 2 row counts x 2 rounds (one warms up) x (evict, memory pass, cache pass, cache pass)
    assert len(seen) == 2 * 2 * 2 * 4
    quads = [seen[i:i + 4] for i in range(0, len(seen), 4)]
    assert all(q[0] == ("evict", bench_rows.EVICT_BYTES) and q[1][0] != "evict" and q[2] == q[3] != q[1]
               for q in quads)
    assert len({q[1] for q in quads}) == len({q[2] for q in quads}) == 4
