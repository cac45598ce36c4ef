"""Incremental detokenization: what is streamed, piece by piece, equals the final text."""
from __future__ import annotations

import pytest

from inferlab.model.loader import load_checkpoint
from inferlab.sampling import SamplingParams
from inferlab.sequence import Sequence

TEXT = "name = 'héllo wörld ✓ 漢字'  # ünïcode\nprint(name)\n"


@pytest.fixture(scope="module")
def tokenizer():
    return load_checkpoint("target", device="cpu")[1]


def replay(tokenizer, ids, **params):
    """Feed ``ids`` as if generated; return the streamed pieces and the finished sequence."""
    seq = Sequence(0, [1], SamplingParams(max_tokens=len(ids), ignore_eos=True, **params))
    pieces = []
    for t in ids:
        seq.append_token(t, (), tokenizer)
        pieces.append(seq.take_delta())
        if seq.is_finished:
            break
    return pieces, seq


def test_streamed_pieces_equal_the_full_decode(tokenizer):
    ids = tokenizer.encode(TEXT)
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids), "some token must hold part of a character"
    pieces, seq = replay(tokenizer, ids)
    assert "".join(pieces) == seq.output_text() == tokenizer.decode(ids) == TEXT
    assert all("\ufffd" not in p for p in pieces)  # incomplete characters are held back, never shown


def test_stop_string_across_tokens_is_never_streamed(tokenizer):
    ids = tokenizer.encode(TEXT)
    pieces, seq = replay(tokenizer, ids, stop=["wörld ✓"])
    assert seq.finish_reason == "stop"
    assert "".join(pieces) == seq.output_text() == TEXT[: TEXT.index("wörld ✓")]


def test_output_cut_inside_a_character_ends_like_a_full_decode(tokenizer):
    ids = tokenizer.encode("✓")
    assert len(ids) > 1  # the check mark is several byte-level tokens
    pieces, seq = replay(tokenizer, ids[:-1])
    assert "".join(pieces) == seq.output_text() == tokenizer.decode(ids[:-1])


def test_cli_stream_equals_json_text(capsys):
    from inferlab.generate_cli import main

    args = ["def fib(n):", "--max-tokens", "24"]
    main(args)
    streamed = capsys.readouterr().out
    main(args + ["--json"])
    import json

    text = json.loads(capsys.readouterr().out)["text"]
    assert streamed == "def fib(n):" + text + "\n"
