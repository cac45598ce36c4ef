"""``inferlab quantize``: quantize a model and write a folder that ``LLM(model=DIR)`` loads.

    inferlab quantize --model target --method gptq --bits 4 --group-size 128 --out target-gptq
    inferlab quantize --model target --method q4_k --format gguf --out target-q4_k   # DIR/model.gguf

Nothing is written until quantization succeeded, and a new folder appears in one rename, so a
failed run leaves no partial output. ``--out`` never loses a file: a folder holding files inferlab
did not write is refused unless ``--overwrite`` (which then replaces only the files inferlab writes),
and the input model's own folder is refused always. Tokenizer and generation files are copied from
the input folder as they are (chat template and special tokens included).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from inferlab.errors import InferlabError
from inferlab.quant.methods import METHODS, resolve


def build_parser() -> argparse.ArgumentParser:
    from inferlab.cli import HelpFormatter

    p = argparse.ArgumentParser(formatter_class=HelpFormatter, prog="inferlab quantize", description="Quantize a model's linear layers.")
    p.add_argument("--model", default="target", help="target, draft, or an HF model folder (default: target)")
    p.add_argument("--method", required=True, help=f"one of {', '.join(METHODS)}")
    p.add_argument("--bits", type=int, default=None, help="bit width (default: the method's)")
    p.add_argument("--group-size", type=int, default=None, help="columns per scale (default: the method's; "
                   "-1 = one group per row for int4/gptq)")
    p.add_argument("--out", required=True, help="output folder: new, empty, or written by inferlab before")
    p.add_argument("--overwrite", action="store_true", help="write into a folder that holds other files, "
                   "replacing only the files inferlab writes (never the input model's folder)")
    p.add_argument("--format", default="safetensors", choices=("safetensors", "gguf"),
                   help="safetensors: a folder inferlab and transformers load; gguf: a llama.cpp model file "
                        "(q8_0, q4_0, q4_1, q4_k) (default: safetensors)")
    p.add_argument("--calib-samples", type=int, default=64, help="calibration windows, gptq and awq (default: 64)")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per calibration window (default: 512)")
    p.add_argument("--no-act-order", action="store_true", help="gptq: quantize columns in their natural order "
                   "(default: largest Hessian diagonal first)")
    p.add_argument("--sym", action="store_true", help="gptq: symmetric grid, zero point fixed mid-range "
                   "(default: asymmetric)")
    p.add_argument("--quantize-head", action="store_true", help="store the output head quantized too: Q8_0 "
                   "for the llama.cpp methods, INT8 for the others, as llama.cpp does (default: float)")
    p.add_argument("--json", action="store_true", help="print one JSON object (progress still goes to stderr)")
    return p


def exceptions(qcfg: dict) -> list[str]:
    """One line per way a tensor is stored otherwise than the method's default, with how many."""
    counts: dict[str, int] = {}
    for name, own in qcfg.get("modules", {}).items():
        what = ("head as " + own["quant_method"] if name == "lm_head" else
                f"as {own['quant_method']} (the {qcfg['quant_method']} block does not divide their width)"
                if "quant_method" in own else
                f"with group size {own['group_size']} (their width is not a multiple of {qcfg.get('group_size')})")
        counts[what] = counts.get(what, 0) + 1
    return [what if what.startswith("head") else f"{n} tensors {what}" for what, n in counts.items()]


def main(argv: list[str]) -> int:
    import torch

    from inferlab.model.loader import hf_model_folder, load_checkpoint, resolve_model_path
    from inferlab.quant.checkpoint import check_output_folder, save_quantized
    from inferlab.quant.quantize import linear_weight_bytes, quantize_model

    args = build_parser().parse_args(argv)
    method, bits, group = resolve(args.method, args.bits, args.group_size)  # fail before loading anything
    if args.format == "gguf" and method not in ("q8_0", "q4_0", "q4_1", "q4_k"):
        raise InferlabError(f"--format gguf writes llama.cpp blocks: use --method q8_0, q4_0, q4_1 or q4_k "
                            f"(not {method})")
    if method == "awq" and args.format == "safetensors" and bits != 4:
        raise InferlabError("AWQ checkpoints hold 4-bit codes only (the hub's GEMM layout): use --bits 4")
    if args.calib_samples < 1 or args.seq_len < 2:
        raise InferlabError("--calib-samples must be >= 1 and --seq-len >= 2")
    source = resolve_model_path(args.model)
    check_output_folder(Path(args.out), args.overwrite, source)  # before any work
    source = hf_model_folder(source)  # a GGUF (smollm2) is quantized from its fp32 form, an HF folder
    model, tok = load_checkpoint(source, device="cpu", dtype=torch.float32)
    t0 = time.perf_counter()
    qcfg = quantize_model(model, method, bits, group, tokenizer=tok, n_samples=args.calib_samples,
                          seq_len=args.seq_len, act_order=not args.no_act_order, sym=args.sym,
                          quantize_head=args.quantize_head, progress=True)  # tqdm writes to stderr
    seconds = time.perf_counter() - t0
    if args.format == "gguf":
        from inferlab.quant.gguf_export import write_gguf
        path = write_gguf(model, tok, args.out, method, overwrite=args.overwrite)
    else:
        path = save_quantized(model, tok, args.out, qcfg, source=source, overwrite=args.overwrite)
    nbytes, count = linear_weight_bytes(model)
    res = {"out": str(path), "quantization_config": qcfg, "bits_per_weight": round(8 * nbytes / count, 3),
           "linear_weight_bytes": nbytes, "seconds": round(seconds, 1)}
    if args.json:
        print(json.dumps(res))
    else:
        print(f"{method}: {nbytes / 2**20:.2f} MiB of linear weights ({res['bits_per_weight']} bits/weight), "
              f"{seconds:.1f} s -> {path}")
        for line in exceptions(qcfg):
            print(f"  {line}")
    return 0
