"""``inferlab bench rows``: the cost of more rows per format, from memory and from the cache."""
from __future__ import annotations

from inferlab.bench import rows as bench_rows


def test_rows_table_times_memory_and_cache_passes(monkeypatch):
    """Every format and row count gets a ratio to one row, from memory and in cache; the in-cache pass
    calls only layer 0's projections, as many times as the whole model has projections."""
    calls = []
    real = bench_rows.layer_linears

    def counted(model_name, fmt):
        layers = real(model_name, fmt)
        for i, layer in enumerate(layers):
            for m in layer:
                m.register_forward_pre_hook(lambda mod, args, i=i: calls.append(i))
        return layers

    monkeypatch.setattr(bench_rows, "layer_linears", counted)
    res = bench_rows.run("target", formats=("fp32", "fp32-torch", "q8_0"), rows=(1, 5), repeats=1)
    for f in ("fp32", "q8_0"):
        r = res["formats"][f]
        assert set(r["vs_one_row"]) == set(r["in_cache"]["vs_one_row"]) == {"1", "5"}
        assert r["vs_one_row"]["1"] == r["in_cache"]["vs_one_row"]["1"] == 1.0
        assert r["goal_5_rows"]["floor"] > 0 and r["in_cache"]["one_row_ms"] > 0
    n = res["formats"]["fp32"]["linears"]
    # 3 formats x 2 row counts x 2 rounds, a memory pass (every layer) and a cache pass (layer 0 only) each
    assert len(calls) == 3 * 2 * 2 * 2 * n and calls.count(0) > len(calls) // 2
    assert set(res["formats"]["fp32"]["vs_torch"]) == {"1", "5"}
    assert "floor" in bench_rows.table(res)
