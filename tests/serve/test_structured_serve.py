"""Structured outputs through the server, with the official client: OpenAI's ``response_format``
(``json_object``, ``json_schema``) on /v1/completions and /v1/chat/completions, vLLM's extra body
fields (``structured_outputs``, ``guided_json``, ``guided_regex``, ``guided_choice``), and the
one-line 400s for a constraint that cannot compile or a format the server does not know."""
from __future__ import annotations

import json
import re

import openai
import pytest

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

SCHEMA = {"type": "object",
          "properties": {"intent": {"enum": ["refund", "track", "cancel"]},
                         "order_id": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["intent", "order_id"], "additionalProperties": False}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "order", "schema": SCHEMA}}
MESSAGES = [{"role": "user", "content": "Which order, and what do you want done with it?"}]


def valid(text: str) -> bool:
    try:
        return jsonschema.Draft202012Validator(SCHEMA).is_valid(json.loads(text))
    except ValueError:
        return False


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_schema_on_both_routes(client, seed):
    r = client.completions.create(model="draft", prompt="order = ", max_tokens=120, temperature=1.0, seed=seed,
                                  extra_body={"response_format": RESPONSE_FORMAT})
    assert valid(r.choices[0].text), r.choices[0].text
    r = client.chat.completions.create(model="draft", messages=MESSAGES, max_tokens=120, temperature=1.0, seed=seed,
                                       response_format=RESPONSE_FORMAT)
    assert valid(r.choices[0].message.content), r.choices[0].message.content


def test_json_object_and_vllm_fields(client):
    r = client.chat.completions.create(model="draft", messages=MESSAGES, max_tokens=120, temperature=0,
                                       response_format={"type": "json_object"})
    text = r.choices[0].message.content
    assert text.lstrip().startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    r = client.completions.create(model="draft", prompt="x = ", max_tokens=20, temperature=1.0, seed=0, n=3,
                                  extra_body={"guided_choice": ["alpha", "beta", "gamma delta"]})
    assert {c.text for c in r.choices} <= {"alpha", "beta", "gamma delta"}
    r = client.completions.create(model="draft", prompt="x = ", max_tokens=20, temperature=1.0, seed=0,
                                  extra_body={"structured_outputs": {"regex": r"[a-z]{3}-\d{2}"}})
    assert re.fullmatch(r"[a-z]{3}-\d{2}", r.choices[0].text)
    r = client.completions.create(model="draft", prompt="x = ", max_tokens=120, temperature=1.0, seed=4,
                                  extra_body={"guided_json": SCHEMA})
    assert valid(r.choices[0].text)


def test_streamed_constrained_output_validates(client):
    chunks = client.chat.completions.create(model="draft", messages=MESSAGES, max_tokens=120, temperature=1.0,
                                            seed=7, stream=True, response_format=RESPONSE_FORMAT)
    assert valid("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))


@pytest.mark.parametrize("body,match", [
    ({"guided_regex": "(unclosed"}, "regex cannot be compiled"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "json schema cannot be compiled"),
    ({"response_format": {"type": "xml"}}, "response_format type must be text, json_object or json_schema"),
    ({"response_format": {"type": "json_schema"}}, "needs"),
    ({"guided_regex": "a+", "guided_choice": ["a"]}, "give one constraint"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "exactly one of"),
    ({"structured_outputs": {"pattern": "a"}}, "unknown field"),
])
def test_bad_constraints_are_one_line_400s(client, server, body, match):
    for call in (lambda: client.completions.create(model="draft", prompt="x", max_tokens=4, extra_body=body),
                 lambda: client.chat.completions.create(model="draft", messages=MESSAGES, max_tokens=4,
                                                        extra_body=body)):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.status_code == 400
        msg = e.value.body["message"]
        assert match in msg and "\n" not in msg and "Traceback" not in msg
