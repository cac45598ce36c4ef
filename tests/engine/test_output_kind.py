"""vLLM's output kinds: CUMULATIVE reports everything so far each step, DELTA only what is new
(so a stream costs per token, not per token so far), FINAL_ONLY one output at the end. All three
describe the same completion."""
from __future__ import annotations

import pytest

from inferlab.sampling import RequestOutputKind, SamplingParams

from .conftest import make_engine

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n"]


def collect(target, kind):
    engine = make_engine(target)
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=20, stop=["\n\n"], output_kind=kind))
    seen = {str(i): [] for i in range(len(PROMPTS))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen[out.request_id].append(out)
    return seen


def test_the_three_kinds_describe_one_completion(target):
    cumulative = collect(target, RequestOutputKind.CUMULATIVE)
    delta = collect(target, "delta")
    final = collect(target, RequestOutputKind.FINAL_ONLY)
    for rid, outs in cumulative.items():
        whole = outs[-1].outputs[0]
        assert whole.finish_reason is not None and len(outs) > 1
        assert [o.finished for o in final[rid]] == [True]
        assert final[rid][0].outputs[0].text == whole.text and final[rid][0].outputs[0].token_ids == whole.token_ids
        assert len(delta[rid]) == len(outs)
        assert "".join(o.outputs[0].text for o in delta[rid]) == whole.text
        assert sum((o.outputs[0].token_ids for o in delta[rid]), []) == whole.token_ids
        assert all(len(o.outputs[0].token_ids) <= 1 for o in delta[rid])  # one new token per step
        assert delta[rid][-1].outputs[0].finish_reason == whole.finish_reason


def test_bad_output_kind_and_nan_temperature_are_one_line_errors():
    with pytest.raises(ValueError, match="output_kind must be one of"):
        SamplingParams(output_kind="partial")
    with pytest.raises(ValueError, match="temperature must be a number"):
        SamplingParams(temperature=float("nan"))
