"""EleutherAI's lm-evaluation-harness scores through ``inferlab serve`` (its ``local-completions``
backend: token-id prompts, ``echo``, ``logprobs: 1``) and through its own ``hf`` backend on the same
fp32 weights: a multiple-choice task and a perplexity (``loglikelihood_rolling``) task, both written
here as local data, offline. Every loglikelihood agrees within 1e-3 and the accuracies are equal."""
from __future__ import annotations

import json
import math

import pytest

lm_eval = pytest.importorskip("lm_eval")

from inferlab.model.loader import ASSETS  # noqa: E402

# a code model's multiple choice: which continuation is the code (the answer is choice `answer`)
CHOICES = [
    ("def add(a, b):\n    return", [" a + b", " a b +", " return"], 0),
    ("for i in range(10):\n   ", [" print(i)", " range(i)", " for"], 0),
    ("import os\nimport", [" sys", " def", " ("], 0),
    ("class Point:\n    def __init__(self, x, y):\n        self.x =", [" x", " y", " self"], 0),
    ("if __name__ ==", [" '__main__':", " __name__:", " return"], 0),
    ("try:\n    f()\nexcept", [" ValueError:", " else:", " import"], 0),
]
TEXTS = [  # a few lines in the style of the standard library, for perplexity
    "def _splitext(p, sep, altsep, extsep):\n    sepIndex = p.rfind(sep)\n    if altsep:\n"
    "        altsepIndex = p.rfind(altsep)\n        sepIndex = max(sepIndex, altsepIndex)\n",
    "class Error(Exception):\n    \"\"\"Base class for exceptions in this module.\"\"\"\n    pass\n",
    "    def __repr__(self):\n        return '%s(%r)' % (self.__class__.__name__, self.path)\n",
]


def write_tasks(folder) -> None:
    rows = {"inferlab_code_choice": [{"context": c, "choices": ch, "answer": a} for c, ch, a in CHOICES],
            "inferlab_stdlib_ppl": [{"text": t} for t in TEXTS]}
    for name, docs in rows.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    common = {"dataset_path": "json", "test_split": "test"}
    choice = {**common, "task": "inferlab_code_choice", "output_type": "multiple_choice",
              "dataset_kwargs": {"data_files": {"test": str(folder / "inferlab_code_choice.jsonl")}},
              "doc_to_text": "context", "doc_to_choice": "choices", "doc_to_target": "answer",
              "target_delimiter": "", "metric_list": [{"metric": "acc"}]}
    ppl = {**common, "task": "inferlab_stdlib_ppl", "output_type": "loglikelihood_rolling",
           "dataset_kwargs": {"data_files": {"test": str(folder / "inferlab_stdlib_ppl.jsonl")}},
           "doc_to_text": "", "doc_to_target": "{{text}}",
           "metric_list": [{"metric": "word_perplexity"}, {"metric": "bits_per_byte"}]}
    for task in (choice, ppl):  # JSON is YAML
        (folder / f"{task['task']}.yaml").write_text(json.dumps(task, indent=1))


def evaluate(folder, model: str, model_args: str) -> dict:
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(model=model, model_args=model_args,
                                   tasks=["inferlab_code_choice", "inferlab_stdlib_ppl"],
                                   task_manager=TaskManager(include_path=str(folder)), log_samples=True,
                                   batch_size=1, device="cpu")


def logliks(results: dict, task: str) -> list[float]:
    """Every loglikelihood lm-eval computed for ``task``, in document order."""
    out = []
    for sample in sorted(results["samples"][task], key=lambda s: s["doc_id"]):
        for resp in sample["resps"]:
            first = resp[0]
            out.append(float(first[0] if isinstance(first, (list, tuple)) else first))
    return out


@pytest.mark.slow
def test_lm_eval_scores_through_the_server_as_through_transformers(server, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_tasks(tmp_path)
    folder = ASSETS / "draft"
    ours = evaluate(tmp_path, "local-completions",
                    f"model=draft,base_url={server.url}/v1/completions,tokenizer={folder},"
                    "tokenizer_backend=huggingface,tokenized_requests=True,num_concurrent=1,max_retries=1,"
                    "max_length=512")
    ref = evaluate(tmp_path, "hf", f"pretrained={folder},dtype=float32")
    for task in ("inferlab_code_choice", "inferlab_stdlib_ppl"):
        got, want = logliks(ours, task), logliks(ref, task)
        assert len(got) == len(want) > 0 and all(math.isfinite(x) for x in got)
        worst = max(abs(a - b) for a, b in zip(got, want))
        print(f"{task}: {len(got)} loglikelihoods, max |server - hf| = {worst:.2e}")
        assert worst <= 1e-3
    acc = [r["results"]["inferlab_code_choice"]["acc,none"] for r in (ours, ref)]
    print(f"accuracy: server {acc[0]:.3f}, hf {acc[1]:.3f}")
    assert acc[0] == acc[1]
    ppl = [r["results"]["inferlab_stdlib_ppl"]["word_perplexity,none"] for r in (ours, ref)]
    assert ppl[0] == pytest.approx(ppl[1], rel=1e-3)
