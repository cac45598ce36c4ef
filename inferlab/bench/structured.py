"""Structured outputs on smollm2: what a grammar's token mask costs per token, and what it buys.

Mask cost: a JSON schema (a customer-service answer, ``{"intent": ..., "order_id": ...}``) is
compiled for smollm2's 49152-token vocabulary by both backends, xgrammar and llguidance; then, at
batch 1 and 16, each of B matchers walks the tokens of a realistic answer, and every step fills
the B rows of one bitmask and applies it to B rows of logits (the apply is xgrammar's CPU kernel
for both: the bitmask format is the same, and llguidance's torch helper is a ``torch.compile``
kernel). The per-token cost is the step's time over B, best of ``--repeats``; its share of a
decode step is against a plain decode step of the engine at the same batch size, timed in the
same process.

What it buys: 10 customer-service questions through smollm2's chat template, greedy, asked for
the same JSON, with and without the schema: the share of outputs that parse as JSON and that
validate against the schema (``jsonschema``, when installed).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from inferlab.bench.stats import best_time
from inferlab.cli import HelpFormatter

SCHEMA = {"type": "object",
          "properties": {"intent": {"type": "string", "enum": ["refund", "order_status", "cancel", "address_change",
                                                              "complaint", "other"]},
                         "order_id": {"type": ["string", "null"], "maxLength": 12}},
          "required": ["intent", "order_id"], "additionalProperties": False}

QUESTIONS = [
    "I want my money back for order A1234, the blender arrived broken.",
    "Where is my package? Order number 55821.",
    "Please cancel order B-7781 before it ships.",
    "I moved last week; can you send order 90210 to my new address?",
    "Your courier was rude to me and left the box in the rain.",
    "Has order Z42 shipped yet?",
    "Cancel everything I ordered today, order 31337.",
    "Do you sell gift cards?",
    "The shoes from order 6060 are the wrong size, I'd like a refund.",
    "Change the delivery address on order K-100 to 5 Main Street.",
]

ANSWER = '{"intent": "refund", "order_id": "A1234"}'  # the walk each matcher makes


def instruction(question: str) -> str:
    return ("Classify this customer message. Answer with only a JSON object with the keys \"intent\" (one of "
            "refund, order_status, cancel, address_change, complaint, other) and \"order_id\" (the order number "
            f"as a string, or null).\n\nMessage: {question}")


def mask_costs(tokenizer, vocab_size: int, eos_ids, batch_sizes=(1, 16), repeats: int = 5) -> dict:
    """{backend: {batch: seconds per token}} for filling + applying the mask along ``ANSWER``."""
    import xgrammar as xgr

    from inferlab.structured import tokenizer_info

    tokens = tokenizer.encode(ANSWER, add_special_tokens=False) + [eos_ids[0]]
    compiler = xgr.GrammarCompiler(tokenizer_info(tokenizer, vocab_size, eos_ids), max_threads=1)
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA))  # whitespace as JSON allows: both backends alike

    def xgr_walk(b):
        ms = [xgr.GrammarMatcher(compiled) for _ in range(b)]
        mask, logits = xgr.allocate_token_bitmask(b, vocab_size), torch.zeros(b, vocab_size)
        for t in tokens:
            for i, m in enumerate(ms):
                m.fill_next_token_bitmask(mask, i)
            xgr.apply_token_bitmask_inplace(logits, mask)
            for m in ms:
                assert m.accept_token(t), "the answer must follow the schema"

    out = {"xgrammar": {}, "llguidance": {}}
    try:
        import llguidance
        import llguidance.torch as llt
    except ImportError:
        llguidance = None
    if llguidance is not None:
        lltok = llguidance.LLTokenizer(tokenizer.hf.to_str(), n_vocab=vocab_size, eos_token=eos_ids[0])
        grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults={"whitespace_flexible": True})

        def llg_walk(b):
            ms = [llguidance.LLMatcher(lltok, grammar) for _ in range(b)]
            mask, logits = xgr.allocate_token_bitmask(b, vocab_size), torch.zeros(b, vocab_size)
            for t in tokens:
                for i, m in enumerate(ms):
                    llt.fill_next_token_bitmask(m, mask, i)
                xgr.apply_token_bitmask_inplace(logits, mask)
                for m in ms:
                    assert m.consume_token(t), "the answer must follow the schema"
    for b in batch_sizes:
        out["xgrammar"][b] = best_time(lambda: xgr_walk(b), repeats) / (len(tokens) * b)  # per token: per step / b
        if llguidance is not None:
            out["llguidance"][b] = best_time(lambda: llg_walk(b), repeats) / (len(tokens) * b)
    out["tokens_walked"] = len(tokens)
    return out


def decode_step_seconds(llm, batch: int, steps: int = 8, repeats: int = 3) -> float:
    """Best time of one plain decode step of ``batch`` sequences (prefill excluded)."""
    from inferlab.sampling import SamplingParams

    eng, best = llm.llm_engine, float("inf")
    for r in range(repeats):
        for i in range(batch):
            eng.add_request(f"bench-{r}-{i}", instruction(QUESTIONS[i % len(QUESTIONS)]),
                            SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True))
        eng.step()  # the prefills
        eng.step()
        t = time.perf_counter()
        for _ in range(steps):
            eng.step()
        best = min(best, (time.perf_counter() - t) / steps)
        while eng.has_unfinished_requests():
            eng.step()
    return best


def json_share(llm, max_tokens: int = 64) -> dict:
    """Share of greedy answers to ``QUESTIONS`` that parse as JSON / validate, without and with the schema."""
    from inferlab.sampling import SamplingParams
    from inferlab.structured import StructuredOutputsParams

    try:
        import jsonschema
    except ImportError:
        jsonschema = None
    convs = [[{"role": "user", "content": instruction(q)}] for q in QUESTIONS]
    res = {}
    for name, so in (("unconstrained", None), ("constrained", StructuredOutputsParams(json=SCHEMA))):
        outs = llm.chat(convs, SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=so))
        parsed = valid = 0
        texts = [o.outputs[0].text for o in outs]
        for text in texts:
            try:
                value = json.loads(text)
            except ValueError:
                continue
            parsed += 1
            if jsonschema is not None:
                valid += jsonschema.Draft202012Validator(SCHEMA).is_valid(value)
        res[name] = {"parses": parsed / len(texts), "validates": None if jsonschema is None else valid / len(texts),
                     "examples": texts[:2]}
    return res


def run(model: str = "smollm2", batch_sizes=(1, 16), repeats: int = 5, quality: bool = True) -> dict:
    from inferlab.llm import LLM

    llm = LLM(model=model)
    eos = tuple(llm.eos_token_ids)
    vocab = llm.model.config.vocab_size
    costs = mask_costs(llm.tokenizer, vocab, eos, batch_sizes, repeats)
    r = {"model": model, "vocab_size": vocab, "tokens_walked": costs.pop("tokens_walked"), "batch": {}}
    for b in batch_sizes:
        step = decode_step_seconds(llm, b)
        row = {"decode_step_ms": step * 1e3}
        for backend, per in costs.items():
            if b in per:
                row[f"{backend}_ms_per_token"] = per[b] * 1e3
                row[f"{backend}_share_of_step"] = per[b] * b / step
        r["batch"][b] = row
    if quality:
        r["json"] = json_share(llm)
    return r


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="inferlab bench structured", description=__doc__.split("\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--model", default="smollm2", help="model whose tokenizer and decode step are measured")
    p.add_argument("--repeats", type=int, default=5, help="best of this many walks per backend and batch")
    p.add_argument("--no-quality", action="store_true", help="skip the JSON-answer prompts")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    r = run(a.model, repeats=a.repeats, quality=not a.no_quality)
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{r['model']}: vocabulary {r['vocab_size']}, mask filled and applied along a {r['tokens_walked']}-token "
          "JSON answer\n")
    print(f"{'batch':>5}{'decode step':>13}{'xgrammar/token':>16}{'share':>8}{'llguidance/token':>18}{'share':>8}")
    for b, row in r["batch"].items():
        llg = row.get("llguidance_ms_per_token")
        print(f"{b:>5}{row['decode_step_ms']:>10.1f} ms{row['xgrammar_ms_per_token']:>13.3f} ms"
              f"{row['xgrammar_share_of_step']:>8.1%}" + (f"{llg:>15.3f} ms{row['llguidance_share_of_step']:>8.1%}"
                                                          if llg is not None else ""))
    if "json" in r:
        for name, q in r["json"].items():
            v = "" if q["validates"] is None else f", {q['validates']:.0%} validate"
            print(f"\n{name}: {q['parses']:.0%} of {len(QUESTIONS)} answers parse as JSON{v}; e.g. {q['examples'][0]!r}")
    return 0
