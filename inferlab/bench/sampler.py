"""``inferlab bench decode --sampler``: what sampling costs on top of a greedy step.

At batch 32 on the draft model, decode the same prompts greedily and with temperature 0.8, then
with top-p 0.95, then with top-k 50 as well, in interleaved rounds (``best_rates``); each sampled
setting's step cost is reported as a multiple of greedy's. The sampler's goal is at most 1.3x.
"""
from __future__ import annotations

from inferlab.bench.stats import best_rates


def sampler_cost(model: str = "draft", batch: int = 32, new_tokens: int = 16, repeats: int = 7) -> dict:
    """Decode at ``batch``: greedy against temperature 0.8 (+ top-p 0.95, + top-k 50), interleaved."""
    from inferlab.llm import LLM
    from inferlab.sampling import SamplingParams
    llm = LLM(model=model, device="cpu", max_num_seqs=batch)
    prompts = [[(7 * i) % 1000 + 1, 2, 3, 4] for i in range(batch)]
    settings = {"greedy": dict(temperature=0), "temperature": dict(temperature=0.8),
                "top_p": dict(temperature=0.8, top_p=0.95), "top_k_top_p": dict(temperature=0.8, top_p=0.95, top_k=50)}

    def make(kw):
        params = SamplingParams(max_tokens=new_tokens, ignore_eos=True, **kw)
        return lambda n: llm.generate(prompt_token_ids=prompts, sampling_params=params)
    rates = best_rates({k: make(kw) for k, kw in settings.items()}, new_tokens * batch, repeats, decode_only=False)
    return {"model": model, "batch": batch, "new_tokens": new_tokens,
            "tokens_per_s": {k: round(v, 1) for k, v in rates.items()},
            "cost_vs_greedy": {k: round(rates["greedy"] / v, 2) for k, v in rates.items() if k != "greedy"},
            "goal": "sampled <= 1.3x greedy", "met": max(rates["greedy"] / v for v in rates.values()) <= 1.3}
