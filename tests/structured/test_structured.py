"""Structured outputs in the engine, checked against references written elsewhere: ``jsonschema``
validates every JSON output, ``re.fullmatch`` every regex output, the choice list every choice.

On the embedded code models, which never saw a JSON answer: sampled at temperature 1 with
several seeds, every constrained output validates while the unconstrained ones mostly do not
parse. The mask is checked under speculation (n-gram and the draft model, whose guesses ignore the
grammar: a guess that breaks it must be rejected), under preemption, for n > 1, and beside
unconstrained requests, whose outputs it must leave exactly as they are alone.
"""
from __future__ import annotations

import json
import re

import pytest

from inferlab import LLM, SamplingParams
from inferlab.structured import StructuredOutputsParams as SO

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

SCHEMA = {"type": "object",
          "properties": {"intent": {"enum": ["refund", "track", "cancel"]},
                         "order_id": {"type": "integer", "minimum": 0, "maximum": 99999},
                         "note": {"type": "string", "maxLength": 8}},
          "required": ["intent", "order_id", "note"], "additionalProperties": False}
JSON = SO(json=SCHEMA, disable_any_whitespace=True)
PROMPTS = ["def parse(data):\n    return ", "config = ", "import json\nx = json.loads('", "class Order:\n"]
# JSON in the prompt: the n-gram proposer copies it, so guesses meet the grammar often
JSON_PROMPT = ('orders = [\n    {"intent": "refund", "order_id": 12, "note": "late"},\n'
               '    {"intent": "track", "order_id": 7, "note": "box"},\n    ')


def valid(text: str, schema=SCHEMA) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def texts(llm, prompts, **kw):
    return [o.outputs[0].text for o in llm.generate(prompts, SamplingParams(**kw))]


@pytest.fixture(scope="module")
def llm():
    return LLM(model="draft", device="cpu")


@pytest.fixture(scope="module")
def target():
    return LLM(model="target", device="cpu")


def test_every_constrained_output_validates_and_unconstrained_mostly_do_not(llm):
    got = [t for seed in range(3) for t in texts(llm, PROMPTS, temperature=1.0, seed=seed, max_tokens=60,
                                                   structured_outputs=JSON)]
    assert all(valid(t) for t in got), [t for t in got if not valid(t)]
    assert len(set(got)) > 3  # sampled, not one forced string
    free = [t for seed in range(3) for t in texts(llm, PROMPTS, temperature=1.0, seed=seed, max_tokens=60)]
    assert sum(valid(t) for t in free) == 0
    parses = 0
    for t in free:
        try:
            json.loads(t)
            parses += 1
        except ValueError:
            pass
    assert parses < len(free) / 2


def test_grammar_end_finishes_the_sequence(llm):
    (out,) = llm.generate(["x = "], SamplingParams(temperature=1.0, seed=0, max_tokens=200, structured_outputs=JSON))
    c = out.outputs[0]
    assert c.finish_reason == "stop" and valid(c.text) and len(c.token_ids) < 200
    # ignore_eos: the grammar's end still stops it
    (out,) = llm.generate(["x = "], SamplingParams(temperature=1.0, seed=0, max_tokens=200, ignore_eos=True,
                                                   structured_outputs=SO(choice=["yes", "no"])))
    assert out.outputs[0].text in ("yes", "no") and out.outputs[0].finish_reason == "stop"


def test_regex_choice_json_object_and_grammar(llm):
    pattern = r"[a-z]{2,6}_\d{1,3}"
    got = [t for seed in range(3) for t in texts(llm, PROMPTS, temperature=1.0, seed=seed, max_tokens=20,
                                                   structured_outputs=SO(regex=pattern))]
    assert all(re.fullmatch(pattern, t) for t in got), got
    choices = ["yes", "no", "maybe so"]
    got = [t for seed in range(3) for t in texts(llm, PROMPTS, temperature=1.0, seed=seed, max_tokens=20,
                                                   structured_outputs=SO(choice=choices))]
    assert set(got) <= set(choices) and len(set(got)) > 1
    got = texts(llm, PROMPTS, temperature=1.0, seed=0, max_tokens=80,
                structured_outputs=SO(json_object=True, disable_any_whitespace=True))
    for t in got:  # any object; it may run out of tokens inside it, so check the prefix is one
        if t.endswith("}"):
            assert isinstance(json.loads(t), dict)
        assert t.startswith("{")
    got = texts(llm, PROMPTS, temperature=1.0, seed=0, max_tokens=20,
                structured_outputs=SO(grammar='root ::= ("ab" | "cd") ("ab" | "cd")? "!"'))
    assert all(re.fullmatch(r"(ab|cd){1,2}!", t) for t in got), got


def test_bad_constraints_fail_with_one_line_when_added(llm):
    eng = llm.llm_engine
    with pytest.raises(ValueError, match="exactly one of json, regex, choice") as e:
        SO(json=SCHEMA, regex="a+")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="exactly one"):
        SO()
    for bad, what in ((SO(regex="(unclosed"), "regex"), (SO(json={"type": "no-such-type"}), "json schema"),
                      (SO(grammar="root ::= undefined_rule"), "grammar")):
        with pytest.raises(ValueError, match=f"structured_outputs {what} cannot be compiled") as e:
            eng.add_request("bad", "x", SamplingParams(structured_outputs=bad))
        assert "\n" not in str(e.value)
        assert "bad" not in eng.requests and not eng.has_unfinished_requests()
    with pytest.raises(ValueError, match="non-empty list of strings"):
        SamplingParams(structured_outputs={"choice": "yes"})
    assert SamplingParams(structured_outputs={"regex": "a"}).structured_outputs == SO(regex="a")


def test_unconstrained_requests_beside_constrained_ones_are_unchanged(llm):
    eng = llm.llm_engine
    plain = [SamplingParams(temperature=0, max_tokens=24), SamplingParams(temperature=0.8, seed=3, max_tokens=24)]

    def run(with_constrained: bool):
        for i, p in enumerate(plain):
            eng.add_request(f"plain-{i}", PROMPTS[i], p)
            if with_constrained:
                eng.add_request(f"json-{i}", PROMPTS[i + 1], SamplingParams(temperature=1.0, seed=i, max_tokens=60,
                                                                            structured_outputs=JSON))
        finals = {}
        while eng.has_unfinished_requests():
            for o in eng.step():
                if o.finished:
                    finals[o.request_id] = o.outputs[0]
        return finals

    before = eng.structured.num_masked_rows
    alone = run(False)
    assert eng.structured.num_masked_rows == before  # nothing constrained: no mask at all
    mixed = run(True)
    for i in range(len(plain)):
        assert mixed[f"plain-{i}"].token_ids == alone[f"plain-{i}"].token_ids
        assert valid(mixed[f"json-{i}"].text)


def test_n_greater_than_one_each_sequence_has_its_own_matcher(llm):
    (out,) = llm.generate([PROMPTS[0]], SamplingParams(n=4, temperature=1.0, seed=5, max_tokens=60,
                                                       structured_outputs=JSON))
    got = [c.text for c in out.outputs]
    assert len(got) == 4 and all(valid(t) for t in got), got
    assert len(set(got)) > 1


def test_preempted_constrained_sequences_recompute_and_still_validate():
    params = SamplingParams(temperature=0, max_tokens=60, structured_outputs=JSON)
    roomy = LLM(model="draft", device="cpu")
    tight = LLM(model="draft", device="cpu", num_kv_blocks=10, block_size=8)
    want = texts(roomy, PROMPTS, temperature=0, max_tokens=60, structured_outputs=JSON)
    got = [o.outputs[0].text for o in tight.generate(PROMPTS, params)]
    assert tight.llm_engine.num_preemptions > 0
    assert got == want and all(valid(t) for t in got)


@pytest.mark.parametrize("spec", [{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1},
                                  {"model": "draft", "num_speculative_tokens": 3}], ids=["ngram", "draft"])
def test_speculation_masks_every_verified_row(target, spec):
    """Greedy: speculation emits exactly the non-speculative constrained tokens; sampled: every
    output validates. The guesses are proposed without the grammar, so many break it: each
    must be rejected at its row, whose mask is the grammar's state after the guesses before it."""
    prompts = [JSON_PROMPT, JSON_PROMPT + '{"intent": "cancel", ', PROMPTS[1]]
    spec_llm = LLM(model="target", device="cpu", speculative_config=spec)
    want = texts(target, prompts, temperature=0, max_tokens=48, structured_outputs=JSON)
    got = texts(spec_llm, prompts, temperature=0, max_tokens=48, structured_outputs=JSON)
    c = spec_llm.llm_engine.counters
    assert c["spec_decode_num_draft_tokens"] > 0
    assert got == want and all(valid(t) for t in got), (got, want)
    sampled = [t for seed in range(2) for t in texts(spec_llm, prompts, temperature=1.0, seed=seed, max_tokens=48,
                                                       structured_outputs=JSON)]
    assert all(valid(t) for t in sampled), sampled


def test_mask_trace_replays_the_masks_the_engine_applied(llm):
    """At each step of a choice, the mask allows exactly the tokens that keep the text a prefix of a
    choice (checked by decoding every allowed token, not through the grammar), and a token outside
    the mask is refused with one line."""
    from inferlab.structured import mask_trace

    choices = ["refund", "delivery"]
    so = SO(choice=choices)
    out = llm.generate(["status = "], SamplingParams(temperature=0, max_tokens=12, structured_outputs=so))[0].outputs[0]
    assert out.text in choices
    trace = mask_trace(llm, so, out.token_ids)
    assert [st["token"] for st in trace] == list(out.token_ids)
    eos = set(llm.eos_token_ids)
    text = ""
    for st in trace:
        assert st["token"] in st["allowed_ids"]
        for t in st["allowed_ids"]:
            if t in eos:
                assert text in choices, "the stop token is allowed only once a choice is complete"
            else:
                piece = text + llm.tokenizer.decode([t])
                assert any(c.startswith(piece) for c in choices), f"{piece!r} is not a prefix of a choice"
        if st["token"] not in eos:
            text += llm.tokenizer.decode([st["token"]])
    n = len(trace[0]["allowed_ids"])
    assert 2 <= n < 50, "the first step allows the first tokens of both choices, and little else"
    with pytest.raises(ValueError, match="breaks the grammar"):
        mask_trace(llm, so, [llm.encode("zzz")[0]])
