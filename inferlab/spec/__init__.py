"""Speculative decoding: proposers guess k tokens, the target verifies them in one forward.

- ``rejection``: the exact verifier (Leviathan et al. 2023; Chen et al. 2023) and the speedup
  formula it predicts;
- ``ngram``: prompt lookup, a proposer with no model (Saxena 2023, vLLM's ``ngram`` method);
- ``medusa``: k heads on the target's own last hidden state (Cai et al. 2024), trained on the
  frozen target by ``inferlab train medusa`` (``medusa_train``), in the engine as
  ``inferlab.engine.medusa``;
- ``config``: ``speculative_config`` in vLLM's shape, checked (the engine's mode:
  ``inferlab.engine.llm_engine``, with the draft model in ``inferlab.engine.draft``);
- ``reference``: the single-sequence loop on the contiguous cache the engine is checked against.
"""
from inferlab.spec.ngram import NgramProposer
from inferlab.spec.rejection import (
    expected_tokens_per_step, greedy_verify, predicted_speedup, recovered_probs, rejection_sample,
)

__all__ = ["NgramProposer", "expected_tokens_per_step", "greedy_verify", "predicted_speedup", "recovered_probs",
           "rejection_sample"]
