"""Graded tests for lab 08. `inferlab grade labs/08_capstone` runs your deployment() from starter.py;
with --reference, inferlab.strategy.capstone.reference_deployment (one of several that pass). Each
test checks one part of the service target on the same run of the engine (smollm2, answering)."""
import pytest

from inferlab import labkit
from inferlab.strategy import capstone as C
from inferlab.strategy.workload import customer_workload

lab = labkit.implementation(__file__, reference="inferlab.strategy.capstone",
                            functions={"deployment": "reference_deployment"})
T = C.LAB_TARGET
_runs: dict = {}


@pytest.fixture(scope="module")
def setting():
    """The workload and the models (each variant loaded once)."""
    return customer_workload(**C.LAB_WORKLOAD), C.Models(device="cpu", **C.LAB_MODELS)


def run(setting) -> dict:
    """Your deployment, served once (every test reads the same report)."""
    dep = lab.deployment()
    try:
        checked = C.check(dep)
    except ValueError as exc:
        raise labkit.LabError(f"deployment() returned something the grader cannot run: {exc}") from None
    key = repr(sorted(checked.items()))
    if key not in _runs:
        _runs[key] = C.serve(checked, setting[0], setting[1])
    return _runs[key]


@labkit.points(1)
def test_deployment_is_valid():
    dep = lab.deployment()
    try:
        C.check(dep)
    except ValueError as exc:
        labkit.expect(False, f"deployment() must return a dict of known switches: {exc}", returned=dep)


@labkit.points(3)
def test_ttft_target(setting):
    r = run(setting)
    labkit.expect(r["ttft_steps_p99"] <= T["ttft_steps_p99"],
                  f"TTFT p99 is {r['ttft_steps_p99']:g} steps, the target is {T['ttft_steps_p99']}: requests wait "
                  "in the queue at the peak. A static batch makes newcomers wait for its longest request "
                  "(continuous batching admits them at the next step), and max_num_seqs caps how many run at once; "
                  "a cache hit needs no step at all",
                  ttft_steps_p50=r["ttft_steps_p50"], max_num_seqs=C.check(lab.deployment())["max_num_seqs"])


@labkit.points(2)
def test_kv_memory_budget(setting):
    r = run(setting)
    labkit.expect(r["kv_peak_blocks"] <= T["kv_peak_blocks"],
                  f"the KV cache peaked at {r['kv_peak_blocks']} blocks, the budget is {T['kv_peak_blocks']}: "
                  "every request holds its own copy of the shared system prompt unless prefix caching shares "
                  "its blocks; more sequences at once also hold more blocks", kv_peak_bytes=r["kv_peak_bytes"])


@labkit.points(3)
def test_cost_budget(setting):
    r = run(setting)
    labkit.expect(r["cost"] <= T["cost"],
                  f"the run costs {r['cost']:.1f} fp16 steps of the large model, the budget is {T['cost']}: each "
                  "step reads every weight once, so fewer bits per weight (quantization) or fewer steps "
                  "(requests answered from the cache, steps that are never half empty) cost less",
                  engine_steps=r["engine_steps"], served_by=r["by"])


@labkit.points(3)
def test_quality(setting):
    r = run(setting)
    labkit.expect(r["grounded"] >= T["grounded"],
                  f"{r['grounded']:.0%} of the in-scope answers state the FAQ fact their question needs, the target is "
                  f"{T['grounded']:.0%}: smollm2 reads its FAQ entry poorly and grounds few of its own answers (notebook "
                  "08), whatever the weights' format; the FAQ's own answers state their facts, and the semantic cache "
                  "serves them", served_by=r["by"], cache_hits=r["cache_hits"])
    labkit.expect(r["wrong_answers"] <= T["wrong_answers"],
                  f"the semantic cache served {r['wrong_answers']} wrong answers (at most {T['wrong_answers']}): "
                  "near misses sit as close as paraphrases, so a low threshold answers the wrong question; "
                  "questions.calibrated gives the threshold with an error bound", cache_hits=r["cache_hits"])
