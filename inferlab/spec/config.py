"""``speculative_config``: how the engine speculates, in vLLM's shape, checked with one-line errors.

    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    {"model": "draft", "num_speculative_tokens": 4}      (method "draft": a smaller model guesses)
    {"method": "medusa", "num_speculative_tokens": 3}    (Medusa heads on the target; "model" may name
                                                          the heads' folder, else <target>_medusa)
    {"method": "eagle", "num_speculative_tokens": 4}     (an EAGLE draft over the target's features;
                                                          "model" may name its folder, else <target>_eagle)
    {"method": "eagle", "num_speculative_tokens": 4, "confidence_threshold": 0.3}
                                                         (draft, medusa, eagle: stop a sequence's guesses
                                                          where the proposer's chance that they are all
                                                          accepted falls below 0.3; EAGLE-2's confidence)

``num_speculative_tokens`` (k) is how many guesses each decoding sequence gets per step; every
guess costs a query row in the verify forward whether it is kept or not, so k is capped.
"""
from __future__ import annotations

import dataclasses

from inferlab.spec.ngram import NgramProposer

MAX_SPECULATIVE_TOKENS = 16
METHODS = ("ngram", "draft", "medusa", "eagle")


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3
    model: str | None = None  # the draft model (method "draft"): an embedded name or an HF folder;
    # the heads' folder (method "medusa"; None: beside the target, ``inferlab.spec.medusa.heads_folder_for``)
    confidence_threshold: float = 0.0  # draft, medusa, eagle: ``inferlab.engine.proposer.cut_chain``

    @classmethod
    def from_dict(cls, d: "dict | SpeculativeConfig | None") -> "SpeculativeConfig | None":
        """Check a user's dict; None stays None (no speculation)."""
        if d is None or isinstance(d, SpeculativeConfig):
            return d
        if not isinstance(d, dict):
            raise ValueError(f"speculative_config must be a dict such as {{'method': 'ngram', "
                             f"'num_speculative_tokens': 3}}, got {type(d).__name__}")
        d = dict(d)
        if d.get("model") in ("ngram", "[ngram]"):  # vLLM's older spelling
            d.setdefault("method", "ngram")
            del d["model"]
        if "model" in d:
            if d.setdefault("method", "draft") in ("draft_model", "draft"):  # vLLM calls it draft_model
                d["method"] = "draft"
        elif d.get("method") in ("draft", "draft_model"):
            raise ValueError("the draft method needs a model, e.g. {'model': 'draft', 'num_speculative_tokens': 4}")
        model = d.pop("model", None)
        method = d.pop("method", None)
        if method not in METHODS:
            raise ValueError(f"unknown speculative method {method!r}: choose one of {', '.join(METHODS)}")
        if "num_speculative_tokens" not in d:
            raise ValueError("speculative_config needs num_speculative_tokens (e.g. 3)")
        k = d.pop("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be an integer in 1..{MAX_SPECULATIVE_TOKENS}, got {k!r}")
        if method in ("medusa", "eagle", "draft"):
            threshold = d.pop("confidence_threshold", 0.0)
            if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold < 1:
                raise ValueError(f"confidence_threshold must be a number in [0, 1) (0: always k guesses), "
                                 f"got {threshold!r}")
            if d:
                takes = "model and num_speculative_tokens" if method == "draft" else \
                    f"num_speculative_tokens and, optionally, model (the {method} folder)"
                raise ValueError(f"unknown speculative_config keys {sorted(d)}: the {method} method takes "
                                 f"{takes}, and optionally confidence_threshold")
            return cls(method, k, model=None if model is None else str(model), confidence_threshold=float(threshold))
        if model is not None:
            raise ValueError(f"the ngram method uses no model, got model={model!r}: drop it, or use method 'draft'")
        lo, hi = d.pop("prompt_lookup_min", 1), d.pop("prompt_lookup_max", 3)
        if d:
            raise ValueError(f"unknown speculative_config keys {sorted(d)}: the ngram method takes "
                             "num_speculative_tokens, prompt_lookup_min and prompt_lookup_max")
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise ValueError(f"need integers 1 <= prompt_lookup_min <= prompt_lookup_max, got {lo!r} and {hi!r}")
        return cls(method, k, lo, hi)

    def make_proposer(self) -> NgramProposer:
        return NgramProposer(self.num_speculative_tokens, self.prompt_lookup_min, self.prompt_lookup_max)
