"""Every option of every command says what it does in ``--help`` (and its default, through
``cli.HelpFormatter``): the parsers are captured as each command builds them."""
from __future__ import annotations

import argparse
import importlib

import pytest

from inferlab.bench import BENCHES
from inferlab.cli import COMMANDS


class _Captured(Exception):
    pass


def _commands():
    for name, (module, _) in COMMANDS.items():
        if name == "bench":
            yield from ((f"bench {b}", m) for b, (m, _) in BENCHES.items())
        elif name != "eval":  # eval dispatches to its harnesses, like bench
            yield name, module
    yield "eval ppl", "inferlab.eval.ppl"


@pytest.mark.parametrize("name,module", list(_commands()))
def test_every_option_has_help(name, module, monkeypatch):
    parsers = []

    def capture(self, *args, **kwargs):
        parsers.append(self)
        raise _Captured

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    try:
        importlib.import_module(module).main([])
    except _Captured:
        pass
    assert parsers, f"{name}: no parser was built"
    missing = [a.option_strings[-1] for p in parsers for a in p._actions
               if a.option_strings and a.help is None and "--help" not in a.option_strings]
    assert not missing, f"`inferlab {name} --help` lists options with no description: {missing}"
