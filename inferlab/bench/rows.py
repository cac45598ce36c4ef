"""What more rows cost: every product of a model's layers called with 1, 2, 5, 9 and 17 rows, per format.

A decode step multiplies each weight by as many rows as it has sequences; a speculative verify by
k + 1 rows. On a memory-bound model the weights' bytes set the time, so a loop that reads each
weight once for all its rows makes the extra rows nearly free: that ratio is the ``v`` of
speculative decoding (Leviathan et al. 2023: the cost of a verify forward over one decode step)
and the marginal cost of a sequence in a batch. Each format is timed through the loops a decode
step runs (q|k|v and gate|up packed into one product each, as the engine packs them), all of a
pass's linears in one C call (``decode_layers.LinearsCall``), so no Python sits
between them to flatten the ratios (a module call costs 10-20 us, as much as a small product); a
format without loops here runs its modules instead, and ``fp32-torch`` is ``F.linear`` on the same
weights for comparison. Rows of every (format, row count) are interleaved round-robin, best of
``--repeats``, so each ratio compares runs made under the same machine load.

Every pass from memory starts with none of its weights in the CPU's cache: a 256 MB buffer is read
just before it. The last-level cache (32 MB on the machine these figures come from) keeps a part
of a 66 MB pass for later passes over the same weights, more the more passes in a row, so without
this the row count timed first after another format's passes found its weights colder than the
rest: one row read 1.5-1.7 ms against 1.2, and 2 rows cost 0.85-0.9x one row. The passes in
cache follow an untimed pass over the same weights.

Where the goal is missed, the second table says why: the same number of calls over the first
layer's projections only, whose weights stay in the CPU's cache, times the arithmetic without the
memory. ``floor`` is that in-cache time for 5 rows over one row from memory: a loop that read the
weights for free could still not do 5 rows in less, so a floor above the goal means the arithmetic
per row (multiplying the codes out, on this many cores), not the reading, is what extra rows cost.
``roof`` is the same over the CPU's peak rate of 8-bit multiply-adds (``vnni.peak_int8_macs``: the
loops' instruction in independent chains, no memory), for the formats whose loops run it: a floor
above the goal with a roof below it is a loop that leaves the CPU's arithmetic idle, not a limit
of the machine (on the 2-core AMD EPYC these figures come from: about 1,000 GMAC/s, so 5 rows of
smollm2's 106 M weights need 0.5 ms where one row reads its Q4_1 weights in 1.2 ms).

    inferlab bench rows --model smollm2 --formats fp32,int8,int4,q8_0,q4_1,q4_k,nf4
"""
from __future__ import annotations

import argparse
import json
import time

import torch
from torch.nn import functional as F

from inferlab.cli import HelpFormatter
from inferlab.loop_settings import held
from inferlab.model.decode_layers import LinearsCall

ROWS = (1, 2, 5, 9, 17)
FORMATS = ("fp32", "fp32-torch", "int8", "int4", "nf4", "q8_0", "q4_0", "q4_1", "q4_k", "stored")
GOAL = 1.15  # 5 rows may cost at most this many times one row


EVICT_BYTES = 256 << 20  # read before each pass from memory: several times any CPU's last-level cache


def evict(buffer: torch.Tensor) -> None:
    """Read ``buffer`` (larger than the CPU's last-level cache), so the next pass finds none of its
    weights there."""
    buffer.sum()


def _pass(call, modules, x, xs: dict, out) -> float:
    """Seconds for one pass over ``modules``: their loops in one C call (``call``) over x, or each
    module on its own input from ``xs`` (by width) where there is no call."""
    with held():  # as a model's forward does: the loop settings read once for the pass
        t = time.perf_counter()
        if call is not None:
            call(x, out)
        else:
            for m in modules:
                m(xs[m.in_features])
        return time.perf_counter() - t


def layer_linears(model_name: str, fmt: str) -> list[list]:
    """The products of each decoder layer of ``model_name`` in format ``fmt``, as a decode step runs
    them: q|k|v and gate|up packed into one product each where the format packs
    (``inferlab.model.packing``; ``fp32-torch`` packs as fp32 does), then o and down. The head
    is left out: it runs once per step, not once per layer, and the engine computes it on sampled
    rows only. Timing the 7 projections one by one would add 3 calls a layer, each with its own
    activation quantization and thread wake-up, that the engine does not make."""
    from inferlab.model.loader import hf_model_folder, load_checkpoint
    from inferlab.model.packing import pack_projections
    from inferlab.quant.quantize import quantize_model

    if fmt == "stored":  # a GGUF's blocks as the file holds them
        model, _ = load_checkpoint(model_name, device="cpu", dtype=torch.float32)
    else:
        model, _ = load_checkpoint(hf_model_folder(model_name), device="cpu", dtype=torch.float32)
        if fmt not in ("fp32", "fp32-torch"):
            quantize_model(model, fmt, progress=False)
    pack_projections(model)
    out = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv, gate_up = attn.__dict__.get("packed_qkv"), mlp.__dict__.get("packed_gate_up")
        products = [*([qkv.fused] if qkv else [attn.q_proj, attn.k_proj, attn.v_proj]), attn.o_proj,
                    *([gate_up.fused] if gate_up else [mlp.gate_proj, mlp.up_proj]), mlp.down_proj]
        out.append([_Torch(m) for m in products] if fmt == "fp32-torch" else products)
    return out


class _Torch(torch.nn.Module):
    """The same weight through ``F.linear`` (the library GEMM), the baseline the loop replaces."""

    def __init__(self, lin):
        super().__init__()
        self.weight, self.bias = lin.weight, lin.bias
        self.in_features, self.out_features = lin.in_features, lin.out_features

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


@torch.inference_mode()
def run(model_name: str = "smollm2", formats=FORMATS, rows=ROWS, repeats: int = 5) -> dict:
    """{format: {rows: seconds for one pass over the layers' linears}, ...} and each ratio to 1 row."""
    per_layer = {f: layer_linears(model_name, f) for f in formats}
    linears = {f: [m for layer in ls for m in layer] for f, ls in per_layer.items()}
    # the same number of calls over layer 0's projections alone: weights from the cache, arithmetic only
    cached = {f: ls[0] * len(ls) for f, ls in per_layer.items()}
    widths = {m.in_features for ls in linears.values() for m in ls}
    torch.manual_seed(0)
    xs = {r: {k: torch.randn(r, k) for k in widths} for r in rows}
    for f in formats:  # build what the loops read (tiles) before the C calls take their pointers
        for m in linears[f]:
            m(xs[1][m.in_features])
    calls = {(f, where): LinearsCall.of(ms) if f != "fp32-torch" else None
             for f in formats for where, ms in (("memory", linears[f]), ("cache", cached[f]))}
    wide = {r: torch.randn(r, max(widths)) for r in rows}
    out_buf = {r: torch.empty(r, max(m.out_features for ls in linears.values() for m in ls)) for r in rows}
    best = {(f, r, where): float("inf") for f in formats for r in rows for where in ("memory", "cache")}
    evictor = torch.ones(EVICT_BYTES // 4)
    for _ in range(repeats + 1):  # the first round warms up (and builds the loops)
        for f in formats:
            for r in rows:
                for where, ms in (("memory", linears[f]), ("cache", cached[f])):
                    args = calls[f, where], ms, wide[r], xs[r], out_buf[r]
                    if where == "memory":  # the cache set first: see the module docstring
                        evict(evictor)
                    else:
                        _pass(*args)
                    best[f, r, where] = min(best[f, r, where], _pass(*args))
    out = {}
    for f in formats:
        one, one_cached = best[f, 1, "memory"], best[f, 1, "cache"]
        out[f] = {"one_row_ms": round(1e3 * one, 2),
                  "vs_one_row": {str(r): round(best[f, r, "memory"] / one, 3) for r in rows},
                  "linears": len(linears[f]),
                  "in_cache": {"one_row_ms": round(1e3 * one_cached, 2),
                               "vs_one_row": {str(r): round(best[f, r, "cache"] / one_cached, 3) for r in rows}}}
        if 5 in rows:
            out[f]["goal_5_rows"] = {"target": f"<= {GOAL}x one row", "value": out[f]["vs_one_row"]["5"],
                                     "met": out[f]["vs_one_row"]["5"] <= GOAL,
                                     # 5 rows' arithmetic alone, over one row from memory
                                     "floor": round(best[f, 5, "cache"] / one, 3)}
    roof = _roof(per_layer, formats, out)
    if "fp32" in formats and "fp32-torch" in formats:
        out["fp32"]["vs_torch"] = {str(r): round(best["fp32-torch", r, "memory"] / best["fp32", r, "memory"], 3) for r in rows}
    for f in formats:
        out[f]["timed"] = "C loops, one call a pass" if calls[f, "memory"] is not None else "module calls"
    return {"model": model_name, "threads": torch.get_num_threads(), "repeats": repeats, "roof": roof,
            "timing": "one pass over every layer product (q|k|v and gate|up packed where the format packs), best of repeats, formats and row counts interleaved",
            "formats": out}


#: Formats whose loops multiply 8-bit activation codes (INT8's keep 16 bits).
INT8_LOOPS = ("int4", "nf4", "q8_0", "q4_0", "q4_1", "q4_k", "stored")


def _roof(per_layer: dict, formats, out: dict) -> dict | None:
    """The CPU's peak rate of 8-bit multiply-adds (``vnni.peak_int8_macs``) and, for each format
    whose loops run at that rate's instructions, the least 5 rows could cost at it, over one row:
    a goal the roof allows but the floor misses is the loop's arithmetic, not the machine's."""
    from inferlab.quant import vnni
    rate = vnni.peak_int8_macs(torch.get_num_threads())
    if rate is None:
        return None
    some = next(iter(per_layer.values()))
    macs = sum(m.in_features * m.out_features for layer in some for m in layer)
    roof = {"gmacs": round(rate / 1e9, 1), "macs_per_row": macs}
    for f in formats:
        if f in INT8_LOOPS and "goal_5_rows" in out[f]:
            out[f]["goal_5_rows"]["roof"] = round(5 * macs / rate / (out[f]["one_row_ms"] / 1e3), 3)
    return roof


def table(res: dict) -> str:
    rows = list(next(iter(res["formats"].values()))["vs_one_row"])
    lines = [f"{res['model']}, {res['threads']} threads: cost of N rows / cost of 1 row, every layer product as a decode step runs them",
             f"{'format':<11} {'1 row ms':>9} " + " ".join(f"{r + ' rows':>8}" for r in rows[1:]) + "  5 rows goal"]
    for f, r in res["formats"].items():
        goal = r.get("goal_5_rows")
        lines.append(f"{f:<11} {r['one_row_ms']:>9.1f} " + " ".join(f"{r['vs_one_row'][n]:>7.2f}x" for n in rows[1:])
                     + ("" if goal is None else f"  {'met' if goal['met'] else 'MISSED'} ({goal['target']})")
                     + ("" if r["timed"].startswith("C") else f"  [{r['timed']}]"))
    lines.append("in cache (layer 0's projections as many times: the arithmetic alone; floor = 5 rows in cache "
                 "over 1 row from memory)")
    lines.append(f"{'format':<11} {'1 row ms':>9} " + " ".join(f"{r + ' rows':>8}" for r in rows[1:]) + "  floor   roof")
    for f, r in res["formats"].items():
        c, goal = r["in_cache"], r.get("goal_5_rows")
        lines.append(f"{f:<11} {c['one_row_ms']:>9.1f} " + " ".join(f"{c['vs_one_row'][n]:>7.2f}x" for n in rows[1:])
                     + ("" if goal is None else f"  {goal['floor']:.2f}x")
                     + ("" if goal is None or "roof" not in goal else f"  {goal['roof']:.2f}x"))
    if res.get("roof"):
        lines.append(f"roof = 5 rows' 8-bit multiply-adds at this CPU's peak rate ({res['roof']['gmacs']:.0f} GMAC/s on "
                     f"{res['threads']} threads, no memory) over 1 row from memory: the least any loop could cost")
    if "vs_torch" in res["formats"].get("fp32", {}):
        lines.append("fp32 loop vs F.linear (speedup): " + ", ".join(
            f"{n} rows {v:.2f}x" for n, v in res["formats"]["fp32"]["vs_torch"].items()))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(formatter_class=HelpFormatter, prog="inferlab bench rows", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="model name or folder (default: smollm2)")
    p.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated, of {', '.join(FORMATS)}")
    p.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts; the first is the baseline's")
    p.add_argument("--repeats", type=int, default=5, help="rounds, best kept (default: 5)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    formats = [f for f in args.formats.split(",") if f]
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        p.error(f"unknown format {bad[0]!r}: choose from {', '.join(FORMATS)}")
    try:
        rows = tuple(int(r) for r in args.rows.split(","))
    except ValueError:
        p.error("--rows takes comma-separated integers, e.g. 1,2,5")
    if rows[0] != 1 or min(rows) < 1 or max(rows) > 32 or args.repeats < 1:
        p.error("--rows must start at 1 and stay within 1..32, and --repeats must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    res = run(args.model, formats, rows, args.repeats)
    print(json.dumps(res, indent=1) if args.json else table(res))
    return 0
