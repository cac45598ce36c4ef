"""One rule for the tokens that fit after a prompt, used by the engine, the server and generate()."""
from __future__ import annotations

import pytest

from inferlab.model.context import ContextLengthError, fit_max_tokens, tokens_after_prompt
from inferlab.generate import generate
from inferlab.sampling import SamplingParams

from .conftest import make_engine, run_all


def test_the_rule():
    assert tokens_after_prompt(10, 16) == 6
    assert fit_max_tokens(None, 10, 16) == 6 and fit_max_tokens(4, 10, 16) == 4 and fit_max_tokens(9, 10, 16) == 6
    assert fit_max_tokens(6, 10, 16, strict=True) == 6
    with pytest.raises(ContextLengthError, match="lower max_tokens") as err:
        fit_max_tokens(7, 10, 16, strict=True)
    assert err.value.param == "max_tokens" and "\n" not in str(err.value)
    for prompt_len in (16, 17):
        with pytest.raises(ContextLengthError, match="shorten the prompt") as err:
            fit_max_tokens(1, prompt_len, 16)
        assert err.value.param == "prompt"
    with pytest.raises(ContextLengthError, match="at least 1"):
        fit_max_tokens(0, 3, 16)


def test_engine_and_contiguous_path_stop_at_the_same_place(tiny):
    """Both clamp to the context: a request for more tokens than fit ends at the context's end."""
    model, _ = tiny
    context = model.config.max_position_embeddings
    prompt = list(range(3, 3 + context - 5))
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    engine = make_engine(tiny)
    engine.add_request("r", prompt, params)
    got = run_all(engine)["r"].outputs[0]
    ref = generate(model, [prompt], [params])[0]
    assert len(got.token_ids) == len(ref.output_token_ids) == 5 and got.finish_reason == "length"
    with pytest.raises(ValueError, match="shorten the prompt"):
        make_engine(tiny).add_request("long", list(range(3, 3 + context)), params)
