"""Lab 08: the capstone. Return a deployment that meets the service target within the budget.

The workload is one seeded "day" of customer-service chat compressed into 96 engine steps: 24
requests that share one system prompt (the shop's policies), FAQ-like questions (paraphrases,
near misses and an out-of-scope one) from the held-out half of notebook 07's set, arrivals that
peak in the late morning. The grader runs your deployment on the engine with smollm2 answering
(notebook 08) and checks:

    TTFT p99                    <= 8 steps   (time to first token, counted in engine steps)
    KV cache at its peak        <= 64 blocks of 16 tokens
    cost                        <= 45        (weight bytes read, in fp16 steps of smollm2)
    grounded answers            >= 0.6       (in-scope answers that state their question's FAQ fact)
    wrong answers served        <= 2         (by the semantic cache)

Grade your work with `inferlab grade labs/08_capstone`. Keep the name and signature.
"""


def deployment() -> dict:
    """The switches of your deployment, as a dict. Any key you leave out keeps its default:

        "quantization":             None (as stored: Q4_1), "none" (fp32), "int8", "q8_0", "awq", "int4", ...
        "enable_prefix_caching":    False
        "batching_policy":         "static" (or "continuous")
        "max_num_seqs":             8        (1..64)
        "semantic_cache_threshold": None     (or a cosine similarity: serve the FAQ's answers, MiniLM)
        "router_threshold":         None     (or send questions whose draft NLL is <= this to the draft model)
        "speculative":              None     (or n-gram speculative decoding, vLLM's speculative_config:
                                              {"method": "ngram", "num_speculative_tokens": 3})
    """
    raise NotImplementedError("about 4 lines")
