"""Graded tests for lab 09. `inferlab grade labs/09_tensor_parallelism` runs them against
starter.py; with --reference they run against inferlab.parallel.layers, the engine's own forwards.

Every test starts 2 real ranks (two Python processes joined by torch.distributed over gloo, as the
engine's `LLM(..., tensor_parallel_size=2)` does), gives each rank its shard, runs your function on
both, and compares what each rank returns with the unsplit (TP=1) layer computed here."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from inferlab import labkit

FUNCTIONS = ["column_parallel_forward", "row_parallel_forward", "vocab_parallel_embedding"]
lab = labkit.implementation(__file__, reference="inferlab.parallel.layers", functions=FUNCTIONS)
WORLD = 2

# One rank: join the group, run the task on this rank's shard of the inputs, save what it returned
# (or the explanation of what it raised). The all_reduce handed to the student counts its calls.
RANK = r'''
import datetime, sys, torch, torch.distributed as dist
from inferlab import labkit
test_file, rank, world, init, task, inputs, out = sys.argv[1:]
rank, world = int(rank), int(world)
lab = labkit.implementation(test_file, reference="inferlab.parallel.layers", functions=%r)
calls = [0]
def all_reduce(t):
    calls[0] += 1
    dist.all_reduce(t)
    return t
def cols(t, n):  # this rank's slice of the last dimension
    per = t.shape[-1] // world
    return t[..., rank * per:(rank + 1) * per]
def rows(t):
    per = t.shape[0] // world
    return t[rank * per:(rank + 1) * per]
def vocab(table):  # rows [start, start + per) of the table, the last rank padded with zero rows
    per = -(-table.shape[0] // world)
    part = table[rank * per:(rank + 1) * per]
    return torch.cat([part, part.new_zeros(per - part.shape[0], part.shape[1])]), rank * per
def run(d):
    if task == "column":  # with the bias, then without
        return [lab.column_parallel_forward(d["x"], rows(d["w"]), rows(d["b"])),
                lab.column_parallel_forward(d["x"], rows(d["w"]), None)]
    if task == "row":
        return [lab.row_parallel_forward(cols(d["x"], 0), cols(d["w"], 0), d["b"], all_reduce),
                lab.row_parallel_forward(cols(d["x"], 0), cols(d["w"], 0), None, all_reduce)]
    if task == "embedding":
        w, start = vocab(d["table"])
        return lab.vocab_parallel_embedding(d["ids"], w, start, all_reduce)
    if task == "mlp":  # the target's embedding, then its layer-0 MLP: column gate/up, row down
        w, start = vocab(d["table"])
        h = lab.vocab_parallel_embedding(d["ids"], w, start, all_reduce)
        g = lab.column_parallel_forward(h, rows(d["gate"]))
        u = lab.column_parallel_forward(h, rows(d["up"]))
        return lab.row_parallel_forward(F.silu(g) * u, cols(d["down"], 0), None, all_reduce)
import torch.nn.functional as F
try:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20))
except Exception as exc:  # the group itself failed to form (not the student's code): the parent retries
    torch.save({"init_failed": repr(exc)}, out)
    sys.exit(0)
try:
    with torch.no_grad():
        got = run(torch.load(inputs))
    torch.save({"result": got, "all_reduces": calls[0]}, out)
except BaseException as exc:
    torch.save({"error": labkit.explain(exc)}, out)
finally:
    dist.destroy_process_group()
''' % (FUNCTIONS,)


def on_two_ranks(task: str, tmp_path: Path, **inputs) -> list[dict]:
    """Run ``task`` on 2 gloo ranks; each rank's {"result", "all_reduces"}, or a failure that says
    which rank raised what. A group that fails to form (gloo's connection setup, on a busy machine)
    is started again, up to 3 times."""
    for attempt in range(3):
        out = _run(task, Path(tempfile.mkdtemp(dir=tmp_path)), inputs)  # fresh rendezvous file and outputs
        if not any("init_failed" in o for o in out):
            break
    else:
        raise labkit.LabError(f"the 2 ranks could not form a gloo group: {next(o for o in out if 'init_failed' in o)}")
    errors = [(r, o["error"]) for r, o in enumerate(out) if "error" in o]
    if errors:
        # the rank whose own code raised, not the one that lost its peer inside a collective
        r, text = min(errors, key=lambda e: "gloo" in e[1] or "Connection closed" in e[1])
        # an unwritten function reads the same on a rank as here
        raise labkit.LabError(text if text.startswith("not implemented yet") else f"on rank {r} of {WORLD}: {text}")
    return out


def _run(task: str, tmp_path: Path, inputs: dict) -> list[dict]:
    torch.save(inputs, tmp_path / "inputs.pt")
    env = dict(os.environ, OMP_NUM_THREADS="1", INFERLAB_LAB_IMPL=labkit.mode(), PYTHONPATH=os.pathsep.join(
        [str(Path(labkit.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
    init = (tmp_path / "rendezvous").as_uri()
    procs = [subprocess.Popen([sys.executable, "-c", RANK, __file__, str(r), str(WORLD), init, task,
                               str(tmp_path / "inputs.pt"), str(tmp_path / f"rank{r}.pt")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(WORLD)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=90)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise labkit.LabError("the ranks did not finish in 90 s: one rank waited for a collective the "
                                  "other never joined (every rank must call all_reduce the same number of times)")
    out = []
    for r in range(WORLD):
        path = tmp_path / f"rank{r}.pt"
        if not path.exists():
            raise labkit.LabError(f"rank {r} of {WORLD} died without a result:\n{logs[r][-800:]}")
        out.append(torch.load(path))
    return out


def close(got, want, what, tol=1e-5):
    labkit.expect(isinstance(got, torch.Tensor) and got.shape == want.shape,
                  f"{what}: expected a tensor of shape {tuple(want.shape)}, got "
                  f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}")
    err = (got.float() - want.float()).abs().max().item()
    labkit.expect(err <= tol, f"{what}: largest difference {err:.3g} from TP=1 (allowed {tol:g})")


def randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def reduced_once(ranks, what, forwards=1):
    for r, o in enumerate(ranks):
        labkit.expect(o["all_reduces"] == forwards, f"{what} on rank {r} called all_reduce {o['all_reduces']} "
                      f"times in {forwards} forward(s); it must call it exactly once per forward")


@labkit.points(2)
def test_column_parallel_matches_tp1(tmp_path):
    x, w, b = randn(3, 5, 16, seed=1), randn(12, 16, seed=2), randn(12, seed=3)
    ranks = on_two_ranks("column", tmp_path, x=x, w=w, b=b)
    for i, bias in enumerate((b, None)):
        got = torch.cat([o["result"][i] for o in ranks], dim=-1)  # the slices, in rank order
        close(got, F.linear(x, w, bias), f"column_parallel_forward, both ranks' slices joined "
              f"({'with' if bias is not None else 'without'} bias)")
    labkit.expect(all(o["all_reduces"] == 0 for o in ranks), "column_parallel_forward must not communicate")


@labkit.points(3)
def test_row_parallel_matches_tp1_with_one_all_reduce(tmp_path):
    x, w, b = randn(3, 5, 16, seed=4), randn(10, 16, seed=5), randn(10, seed=6)
    ranks = on_two_ranks("row", tmp_path, x=x, w=w, b=b)
    for i, bias in enumerate((b, None)):
        for r, o in enumerate(ranks):
            close(o["result"][i], F.linear(x, w, bias), f"row_parallel_forward on rank {r} "
                  f"({'with' if bias is not None else 'without'} bias)")
    reduced_once(ranks, "row_parallel_forward", forwards=2)


@labkit.points(3)
def test_vocab_parallel_embedding_matches_tp1(tmp_path):
    """37 rows on 2 ranks: rank 0 owns ids 0-18, rank 1 ids 19-36 (its 19th row is padding). The ids
    include both edges of each shard."""
    table = randn(37, 8, seed=7)
    ids = torch.tensor([[0, 18, 19, 36, 5], [36, 36, 1, 20, 18]])
    ranks = on_two_ranks("embedding", tmp_path, table=table, ids=ids)
    for r, o in enumerate(ranks):
        close(o["result"], F.embedding(ids, table), f"vocab_parallel_embedding on rank {r}", tol=0)
    reduced_once(ranks, "vocab_parallel_embedding")


@labkit.points(2)
def test_target_embedding_and_mlp_match_tp1(tmp_path):
    """The embedded target model's own weights: its embedding (4096 ids) and its layer-0 MLP
    (SwiGLU, 256 -> 768 -> 256), sharded as the engine shards them."""
    from safetensors import safe_open

    from inferlab.model.loader import resolve_model_path

    with safe_open(str(resolve_model_path("target") / "model.safetensors"), "pt") as f:
        w = {k: f.get_tensor(f"model.{n}.weight").float() for k, n in
             (("table", "embed_tokens"), ("gate", "layers.0.mlp.gate_proj"), ("up", "layers.0.mlp.up_proj"),
              ("down", "layers.0.mlp.down_proj"))}
    ids = torch.tensor([[5, 77, 301, 12, 4000, 9, 2047, 2048, 4095]])
    ranks = on_two_ranks("mlp", tmp_path, ids=ids, **w)
    h = F.embedding(ids, w["table"])
    want = F.linear(F.silu(F.linear(h, w["gate"])) * F.linear(h, w["up"]), w["down"])
    for r, o in enumerate(ranks):
        close(o["result"], want, f"the target's embedding + layer-0 MLP on rank {r}")
        labkit.expect(o["all_reduces"] == 2, f"embedding + MLP on rank {r} made {o['all_reduces']} all-reduces; "
                      "TP makes 2 (one for the embedding, one for the MLP's down projection)")
