"""Structured outputs: a grammar decides which tokens may come next (vLLM's structured outputs).

``SamplingParams(structured_outputs=StructuredOutputsParams(json=schema))`` (or ``regex=``,
``choice=[...]``, ``grammar=`` in EBNF, ``json_object=True``) constrains a request's output to a
language. The grammar is compiled once per request against the tokenizer's vocabulary; each
step, a *matcher* (a pushdown automaton over the tokens emitted so far) fills one bit per
vocabulary entry: may this token come next? The bits are a token bitmask [rows, ceil(V / 32)]
int32, and applying it sets the logits of forbidden tokens to -inf *before* sampling, so the
sampler, the rejection sampler and the log-probs all see the constrained distribution. The
grammar's end state allows only the stop token: a finished JSON value ends the sequence.
(Willard & Louf 2023 compile a regex into a finite automaton over tokens; XGrammar, Dong et al.
2024, handles context-free grammars with a pushdown automaton and precomputes the masks of the
tokens whose fate does not depend on the stack, so a step checks only the few that do.)

Where it sits in the step (``StructuredOutputs``, called from ``LLMEngine``):

- ``check`` compiles a request's grammar when it is added: a schema or regex the backend cannot
  compile fails ``add_request`` with one line, never a step.
- ``apply`` masks the logits of the step's ready rows: one bitmask for every constrained row,
  one in-place apply; the rows of unconstrained sequences are not touched, and a step with no
  constrained sequence costs one scan of its params. Under speculative decoding a sequence has
  1 + k rows, row i verifying guess i: it gets the mask of the grammar state *after* guesses
  0..i-1, so the matcher advances through the guesses, fills each row's mask, and rolls back.
  A guess the grammar forbids has probability 0 under its row's masked p: the verifier (greedy
  or rejection sampling) rejects it and draws the replacement from the masked row; the rows after
  it are never read, so they stay unmasked.
- ``accept`` advances a sequence's matcher by each token it emits and says when the grammar is
  terminated (the sequence then finishes with reason ``"stop"``).

The matcher follows the sequence's output tokens, never its KV cache, so a preempted sequence
(recomputed from its prompt and output) keeps its matcher, and each of the n > 1 sequences of a
request gets its own, created from the request's compiled grammar when it first needs one.

Backend: xgrammar (Dong et al. 2024, vLLM's default) rather than llguidance. Both have CPU wheels,
a matcher that rolls back (speculative verification needs it) and masks that cost little next to
a decode step. ``inferlab bench structured`` times both on smollm2's 49152-token vocabulary,
along a 21-token JSON answer: xgrammar filled and applied a mask in 0.58 ms per token at batch 1
and 0.28 ms at batch 16, llguidance in 1.42 ms and 0.53 ms (a loaded 2-core Xeon, both in the
same process), so xgrammar costs about half. It also ships a C++ kernel that applies the bitmask
to CPU tensors, where llguidance's torch helper is a ``torch.compile`` kernel (a long first
compile on a CPU). Imported only when a request is constrained.
"""
from __future__ import annotations

import dataclasses
import json
import weakref
from collections import OrderedDict

import torch


@dataclasses.dataclass
class StructuredOutputsParams:
    """Exactly one constraint, under vLLM's names: ``json`` (a JSON schema, as a dict or its
    JSON text), ``regex`` (the whole output matches it), ``choice`` (the output is one of these
    strings), ``grammar`` (an EBNF grammar, GBNF style, whose root rule is ``root``) or
    ``json_object=True`` (any JSON object). ``disable_any_whitespace``: JSON in its compact form
    (no whitespace the schema does not need), which also keeps a model from wandering in spaces."""

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self):
        set_ = [name for name in ("json", "regex", "choice", "grammar", "json_object")
                if getattr(self, name) not in (None, False)]
        if len(set_) != 1:
            raise ValueError("structured_outputs takes exactly one of json, regex, choice, grammar, json_object; "
                             f"got {', '.join(set_) if set_ else 'none'}")
        if self.choice is not None:
            if isinstance(self.choice, str) or not all(isinstance(c, str) for c in self.choice) or not self.choice:
                raise ValueError(f"structured_outputs choice must be a non-empty list of strings, got {self.choice!r}")
            self.choice = list(self.choice)
        if isinstance(self.json, str):
            try:
                self.json = _json.loads(self.json)
            except ValueError as e:
                raise ValueError(f"structured_outputs json is not valid JSON text ({e}): give a JSON schema") from None
        if self.json is not None and not isinstance(self.json, (dict, bool)):
            raise ValueError(f"structured_outputs json must be a JSON schema (an object), got {type(self.json).__name__}")

    @classmethod
    def coerce(cls, value) -> "StructuredOutputsParams | None":
        """A ``StructuredOutputsParams``, or the same fields as a dict (a server request body)."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - {f.name for f in dataclasses.fields(cls)}
            if unknown:
                raise ValueError(f"structured_outputs has unknown field(s) {', '.join(sorted(unknown))}: use json, "
                                 "regex, choice, grammar, json_object or disable_any_whitespace")
            return cls(**value)
        raise ValueError(f"structured_outputs must be a StructuredOutputsParams or a dict, got {type(value).__name__}")

    def key(self) -> str:
        """One string per distinct constraint: the compiled-grammar cache's key."""
        return _json.dumps(dataclasses.asdict(self), sort_keys=True)


_json = json  # the field named ``json`` shadows the module inside the class body


def tokenizer_info(tokenizer, vocab_size: int, stop_token_ids):
    """xgrammar's view of an ``inferlab.model.tokenizer.Tokenizer``: each id's token string, how
    strings map to bytes (byte-level BPE as GPT-2's and SmolLM2's, SentencePiece byte fallback,
    or raw), the logits' width (``vocab_size``: a model may pad past the tokenizer) and the
    tokens that end a sequence."""
    import xgrammar as xgr

    hf = tokenizer.hf
    vocab = [""] * vocab_size
    for tok, i in hf.get_vocab(with_added_tokens=True).items():
        if i < vocab_size:
            vocab[i] = tok
    spec = json.loads(hf.to_str())
    parts = json.dumps(spec.get("decoder"))
    if "ByteLevel" in parts:
        kind, prefix = xgr.VocabType.BYTE_LEVEL, False
    elif "ByteFallback" in parts:
        kind, prefix = xgr.VocabType.BYTE_FALLBACK, "Prepend" in json.dumps(spec.get("normalizer")) or \
            "Metaspace" in json.dumps(spec.get("pre_tokenizer"))
    else:
        kind, prefix = xgr.VocabType.RAW, False
    return xgr.TokenizerInfo(vocab, kind, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids),
                             add_prefix_space=prefix)


class StructuredOutputs:
    """The engine's grammars: compiled ones by constraint (a small LRU), one matcher per sequence."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids, cache_size: int = 64):
        self.tokenizer, self.vocab_size, self.stop_token_ids = tokenizer, vocab_size, tuple(stop_token_ids)
        self._compiler = None
        self._compiled: OrderedDict[str, object] = OrderedDict()
        self.cache_size = cache_size
        self._matchers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # seq -> GrammarMatcher
        self.num_masked_rows = 0  # rows masked so far (tests and benchmarks read it)

    # ---- compiling ------------------------------------------------------------------------------
    def check(self, params) -> None:
        """Compile ``params``' grammar now (cached), so a bad one fails when the request is added."""
        if params.structured_outputs is not None:
            self.compiled(params.structured_outputs)

    def compiled(self, so: StructuredOutputsParams):
        key = so.key()
        hit = self._compiled.get(key)
        if hit is not None:
            self._compiled.move_to_end(key)
            return hit
        if self.tokenizer is None:
            raise ValueError("structured outputs need the model's tokenizer (tokenizer.json) to map the grammar to tokens")
        c = self._compiler_for()
        ws = not so.disable_any_whitespace
        try:
            if so.json is not None:
                g = c.compile_json_schema(json.dumps(so.json), any_whitespace=ws)
            elif so.json_object:
                g = c.compile_json_schema(json.dumps({"type": "object"}), any_whitespace=ws)
            elif so.regex is not None:
                g = c.compile_regex(so.regex)
            elif so.choice is not None:
                g = c.compile_grammar("root ::= " + " | ".join(json.dumps(x) for x in so.choice))
            else:
                g = c.compile_grammar(so.grammar)
        except Exception as e:  # xgrammar raises RuntimeError / ValueError / its own errors
            what = "json schema" if so.json is not None else "regex" if so.regex is not None else \
                "grammar" if so.grammar is not None else "constraint"
            reason = " ".join(str(e).split())[:300]
            raise ValueError(f"structured_outputs {what} cannot be compiled: {reason}") from None
        self._compiled[key] = g
        if len(self._compiled) > self.cache_size:
            self._compiled.popitem(last=False)
        return g

    def _compiler_for(self):
        if self._compiler is None:
            try:
                import xgrammar as xgr
            except ImportError:
                raise ValueError("structured outputs need the xgrammar package: pip install 'xgrammar>=0.2'") from None
            info = tokenizer_info(self.tokenizer, self.vocab_size, self.stop_token_ids)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        return self._compiler

    # ---- per sequence ---------------------------------------------------------------------------
    def matcher(self, seq):
        """The sequence's matcher, created on first use and fed the tokens it already emitted."""
        m = self._matchers.get(seq)
        if m is None:
            import xgrammar as xgr

            # the grammar ends on any token that ends this request: the model's eos and the request's
            # own stop ids (a chat template's end-of-turn token among them)
            stops = list(dict.fromkeys([*self.stop_token_ids, *seq.params.stop_token_ids]))
            m = xgr.GrammarMatcher(self.compiled(seq.params.structured_outputs), override_stop_tokens=stops)
            for t in seq.output_token_ids:
                if not m.accept_token(t):
                    raise RuntimeError(f"sequence {seq.seq_id}'s output breaks its grammar at token {t}")
            self._matchers[seq] = m
        return m

    def accept(self, seq, token: int) -> bool:
        """Advance ``seq``'s matcher by the token it just emitted; True when the grammar is
        terminated (the sequence must stop). Every emitted token was drawn from a masked row, so
        a token the grammar refuses is a bug, reported as one."""
        m = self._matchers.get(seq)
        if m is None:  # first token: the matcher is built from the output, this token included
            m = self.matcher(seq)
        elif not m.accept_token(token):
            raise RuntimeError(f"sequence {seq.seq_id} emitted token {token}, which its grammar forbids "
                               "(a row was sampled without its mask)")
        return m.is_terminated()

    # ---- the mask -------------------------------------------------------------------------------
    def apply(self, out, ready: list[int], logits: torch.Tensor, starts: list[int]) -> None:
        """Mask, in place, the rows of ``logits`` that the step samples or verifies with, for the
        ready sequences (indices into ``out.scheduled``) that are constrained. Rows of sequence j
        are ``starts[j]:starts[j + 1]``: the row after its last token, then one per guess."""
        todo = [j for j in ready if out.scheduled[j].seq.params.structured_outputs is not None]
        if not todo:
            return
        import xgrammar as xgr

        # one bitmask for the step, a row per logits row (only the constrained rows are filled and applied)
        bitmask = xgr.allocate_token_bitmask(logits.shape[0], self.vocab_size)
        rows = []
        for j in todo:
            s = out.scheduled[j]
            m, row = self.matcher(s.seq), starts[j]
            m.fill_next_token_bitmask(bitmask, row)
            rows.append(row)
            walked = 0
            for i, tok in enumerate(s.spec_token_ids):  # row i + 1 verifies guess i + 1: the state after guesses 0..i
                if not m.accept_token(tok):
                    break  # guess i is forbidden: rejected at row i, later rows never read
                walked += 1
                if m.is_terminated():
                    break  # guess i was the stop token: the sequence ends there
                m.fill_next_token_bitmask(bitmask, row + i + 1)
                rows.append(row + i + 1)
            if walked:
                m.rollback(walked)  # the matcher follows emitted tokens only; accept() adds the kept ones
        self.num_masked_rows += len(rows)
        if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.is_contiguous():
            xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size, indices=rows)
        else:  # the same bits, unpacked with torch (any dtype, any device)
            allowed = unpack_bitmask(bitmask[rows], logits.shape[-1]).to(logits.device)
            logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[rows, ceil(V / 32)] int32 bits (token t is bit t % 32 of word t // 32) -> [rows, V] bool."""
    bits = torch.arange(32, dtype=torch.int32)
    return ((bitmask[:, :, None] >> bits) & 1).bool().flatten(1)[:, :vocab_size]


def mask_trace(llm, structured_outputs, token_ids: list[int]) -> list[dict]:
    """What the grammar allowed at each step of an output, for a lesson or a debugger: one dict per
    token of ``token_ids``, with ``allowed_ids`` (the vocabulary entries the mask let through at
    that step), ``allowed`` (how many) and ``token`` (the one emitted). Replays the output through
    a fresh matcher of ``llm``'s engine, so it shows exactly the masks the engine applied."""
    import xgrammar as xgr

    so = StructuredOutputsParams.coerce(structured_outputs)
    s = llm.llm_engine.structured
    m = xgr.GrammarMatcher(s.compiled(so), override_stop_tokens=list(s.stop_token_ids))
    bitmask = xgr.allocate_token_bitmask(1, s.vocab_size)
    steps = []
    for i, t in enumerate(token_ids):
        m.fill_next_token_bitmask(bitmask, 0)
        allowed = unpack_bitmask(bitmask, s.vocab_size)[0].nonzero().flatten().tolist()
        steps.append({"token": t, "allowed": len(allowed), "allowed_ids": allowed})
        if not m.accept_token(t):
            raise ValueError(f"token {t} at step {i} breaks the grammar: pass the output that was generated "
                             "under this same constraint")
    return steps
