"""Speculative decoding in the engine's step: the proposer its config asks for, and the verifier.

The proposer (``inferlab.engine.proposer``: ``propose`` before scheduling, ``fill`` after it,
``observe`` after verification) gives each decoding sequence its guesses (``spec_token_ids``), so
the token budget and the KV slots count them. ``verify`` turns the step's logits (the
last 1 + k rows of each sequence, ``ModelRunner.execute(num_logits=...)``) into the tokens each
sequence emits: the accepted guesses and one more (Leviathan et al. 2023; ``inferlab.spec.rejection``).
"""
from __future__ import annotations

import torch

from inferlab.engine.draft import DraftProposer, check_same_tokenizer
from inferlab.engine.eagle import EagleProposer
from inferlab.engine.medusa import MedusaProposer
from inferlab.engine.proposer import PromptLookupProposer, Proposer
from inferlab.model.loader import load_checkpoint
from inferlab.sampling import argmax, probs_from_logits, sample
from inferlab.spec import layer_draft
from inferlab.spec.rejection import greedy_verify, rejection_sample


def make_proposer(config, model, tokenizer) -> Proposer | None:
    """The proposer ``config.speculative_config`` asks for (``inferlab.engine.proposer``'s
    interface): prompt lookup, a draft model, Medusa heads or an EAGLE draft; None without speculation."""
    spec = config.speculative_config
    if spec is None:
        return None
    if spec.method == "ngram":
        return PromptLookupProposer(spec.make_proposer())
    if spec.method == "draft":
        return DraftProposer(draft_model(spec.model, model, tokenizer), model, config.num_kv_blocks, config.block_size,
                             spec.confidence_threshold)
    if spec.model is None:
        raise ValueError(f"the {spec.method} method needs its folder: give speculative_config 'model' "
                         f"(LLM(model=...) finds <model>_{spec.method} itself; train one with "
                         f"`inferlab train {spec.method}`)")
    if spec.method == "eagle":
        return EagleProposer(model, spec.model, config.num_kv_blocks, config.block_size, spec.confidence_threshold)
    return MedusaProposer(model, spec.model, spec.num_speculative_tokens, spec.confidence_threshold)


def draft_model(name, target, tokenizer=None):
    """The draft model ``name`` means for ``target``: a layer draft cut from it (sharing its
    embedding, packed and quantized as the target is; ``spec.layer_draft``), else a model folder
    whose vocabulary must be the target's (its size, and its tokenizer's table when both
    tokenizers are known). A draft that does not fit is a ValueError or
    InferlabError that says what to do."""
    cut = layer_draft.attach(name, target)
    if cut is not None:
        return cut
    draft, draft_tokenizer = load_checkpoint(name, device=target.device, dtype=target.dtype)
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"the draft's vocabulary ({draft.config.vocab_size} tokens) differs from the target's "
                         f"({target.config.vocab_size}): give a draft trained with the target's tokenizer")
    if tokenizer is not None and draft_tokenizer is not None:
        check_same_tokenizer(draft_tokenizer, tokenizer)
    return draft


def verify(out, ready: list[int], logits: torch.Tensor, starts: list[int], draft_probs: dict | None,
           counters: dict, rejection_sampler=None) -> dict[int, list[int]]:
    """The tokens each ready sequence (index into ``out.scheduled``) emits; its logits are rows
    ``starts[j]:starts[j + 1]``. With no guesses: one sampled token, as in plain decoding. With
    guesses: the accepted prefix plus one (greedy: argmax match; sampled: exact rejection
    sampling on the request's p, with the draft's q or, for n-gram, the deterministic-draft rule).
    ``rejection_sampler`` (``rejection_sample``'s signature) replaces the verifier for every
    sequence with guesses, greedy ones too (their p is one-hot): lab 04 plugs its own in.
    Counts vLLM's ``spec_decode_*`` counters."""
    emitted: dict[int, list[int]] = {}
    guesses = {j: out.scheduled[j].spec_token_ids for j in ready}
    greedy = [j for j in ready if out.scheduled[j].seq.params.greedy and not (rejection_sampler and guesses[j])]
    if greedy:
        best = argmax(logits)
        rows = [r for j in greedy for r in range(starts[j], starts[j + 1])]
        if len(rows) < len(best):
            best = best[rows]
        emitted.update(zip(greedy, greedy_verify([guesses[j] for j in greedy], best)))
    plain = [j for j in ready if j not in emitted and not guesses[j]]
    if plain:
        seqs = [out.scheduled[j].seq for j in plain]
        toks = sample(logits[[starts[j] for j in plain]], [s.params for s in seqs], [s.generator for s in seqs])
        emitted.update({j: [t] for j, t in zip(plain, toks.tolist())})
    spec = [j for j in ready if j not in emitted]
    if spec:
        seqs = [out.scheduled[j].seq for j in spec]
        p = torch.cat([probs_from_logits(logits[starts[j]:starts[j + 1]], s.params) for j, s in zip(spec, seqs)])
        q = torch.cat([draft_probs[j] for j in spec]) if draft_probs else None  # n-gram: no q
        verifier = rejection_sampler or rejection_sample
        emitted.update(zip(spec, verifier([guesses[j] for j in spec], p, q, [s.generator for s in seqs])))
    for j in ready:
        if guesses[j]:
            counters["spec_decode_num_drafts"] += 1
            counters["spec_decode_num_draft_tokens"] += len(guesses[j])
            counters["spec_decode_num_accepted_tokens"] += len(emitted[j]) - 1
    return emitted
