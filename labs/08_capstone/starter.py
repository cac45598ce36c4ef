"""Lab 08: the capstone. Return a deployment that meets the service target within the budget.

The workload is one seeded "day" of customer-service chat compressed into 160 engine steps: 40
requests that share one system prompt, FAQ-like questions (with paraphrases, near misses and a
few out-of-scope ones), arrivals that peak in the late morning, answers of 6 to 40 tokens. The
grader runs your deployment on the engine with the embedded target model and checks:

    TTFT p99                    <= 8 steps   (time to first token, counted in engine steps)
    KV cache at its peak        <= 64 blocks of 16 tokens
    cost                        <= 110       (weight bytes read, in fp16 steps of the large model)
    agreement with fp32 greedy  >= 0.85      (tokens of the engine's answers)
    wrong answers served        <= 2         (by the semantic cache)

Grade your work with `inferlab grade labs/08_capstone`. Keep the name and signature.
"""


def deployment() -> dict:
    """The switches of your deployment, as a dict. Any key you leave out keeps its default:

        "quantization":             None (fp32 here, fp16 on a GPU), "int8", "q8_0", "awq", "int4", ...
        "enable_prefix_caching":    False
        "batching_policy":         "static" (or "continuous")
        "max_num_seqs":             8        (1..64)
        "semantic_cache_threshold": None     (or a cosine similarity: serve FAQ answers, scoped by topic)
        "router_threshold":         None     (or send prompts whose draft NLL is <= this to the draft model)
        "speculative":              None     (or n-gram speculative decoding, vLLM's speculative_config:
                                              {"method": "ngram", "num_speculative_tokens": 3})
    """
    raise NotImplementedError("about 4 lines")
