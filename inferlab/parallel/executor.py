"""The engine's ranks: rank 0 is the caller's process, ranks 1..N-1 are worker processes.

Rank 0 keeps everything that decides (scheduler, block manager, sampler, detokenizer). Each step
it sends the step's plain inputs (the ``SeqInput``s, copy-on-write pairs) down a pipe to every
worker, then runs its own model runner; the workers run the same ``ModelRunner`` on the same
inputs, and the collectives inside the layers (``inferlab.parallel.comm``) keep the ranks in
lockstep. nano-vllm does the same with shared memory and events; a pipe also tells a worker when
rank 0 is gone (end of file), so no worker outlives it.

Failures are errors, not hangs: collectives time out (``INFERLAB_TP_TIMEOUT``, 60 s), rank 0
checks that every worker is alive before each step, and once a rank has died the executor
refuses every later step with the same message.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import traceback
import weakref

import torch
import torch.distributed as dist

from inferlab.parallel.comm import Collectives, TensorParallelError


def timeout_s() -> float:
    """Seconds a collective may wait for the other ranks (``INFERLAB_TP_TIMEOUT``, default 60)."""
    return float(os.environ.get("INFERLAB_TP_TIMEOUT", "60"))


@dataclasses.dataclass
class RankSpec:
    """What every rank needs to build its share of the engine (plain, picklable data)."""

    model: str
    world: int
    device: str
    dtype: torch.dtype
    attention_backend: str
    engine_config: object  # EngineConfig
    init_method: str
    timeout_s: float


def _rank_device(device: str, rank: int) -> torch.device:
    d = torch.device(device)
    return torch.device("cuda", rank) if d.type == "cuda" else d


@dataclasses.dataclass
class RankSetup:
    """One rank's share of the engine, as :func:`setup_rank` builds it."""

    model: torch.nn.Module
    tokenizer: object
    engine_config: object  # EngineConfig, with the block count every rank agreed on
    num_kv_heads: int      # this rank's KV heads
    comm: Collectives      # the collectives its layers call, with their counters


def setup_rank(spec: RankSpec, rank: int) -> RankSetup:
    """Join the group, load this rank's shard, agree on the KV block count (all-reduce MIN); the
    same code on every rank."""
    from inferlab.attention import get_backend
    from inferlab.model.packing import pack_projections
    from inferlab.parallel.loader import load_shard

    device = _rank_device(spec.device, rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=spec.init_method, rank=rank, world_size=spec.world,
                            timeout=datetime.timedelta(seconds=spec.timeout_s))
    comm = Collectives(spec.world)
    model, tokenizer = load_shard(spec.model, rank, spec.world, device=device, dtype=spec.dtype, comm=comm)
    pack_projections(model)
    model.set_attention_backend(get_backend(spec.attention_backend))
    num_kv_heads = model.model.layers[0].self_attn.n_kv
    local = dataclasses.replace(model.config, num_key_value_heads=num_kv_heads)  # this rank's KV bytes
    blocks = torch.tensor([spec.engine_config.resolve(local, model.dtype, device).num_kv_blocks], device=device)
    dist.all_reduce(blocks, op=dist.ReduceOp.MIN)
    config = dataclasses.replace(spec.engine_config, num_kv_blocks=int(blocks.item()))
    return RankSetup(model, tokenizer, config, num_kv_heads, comm)


def worker_main(spec: RankSpec, rank: int, conn) -> None:
    """A worker rank: set up, then run the model runner on every step rank 0 sends, until told to
    stop or rank 0 is gone."""
    from inferlab.cache.paged import PagedKVCache
    from inferlab.engine.model_runner import ModelRunner

    if "OMP_NUM_THREADS" not in os.environ and _rank_device(spec.device, rank).type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.world))
    code = 0
    try:
        conn.send(("joining", None))
        mine = setup_rank(spec, rank)
        model, config = mine.model, mine.engine_config
        cache = PagedKVCache.for_model(model.config, config.num_kv_blocks, config.block_size, model.dtype,
                                       model.device, num_kv_heads=mine.num_kv_heads)
        runner = ModelRunner(model, cache)
        conn.send(("ready", None))
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break  # rank 0 is gone
            if msg[0] == "exit":
                break
            _, args, kwargs = msg
            try:
                runner.execute(*args, **kwargs)
            except ValueError:  # bad step inputs, found before any collective on every rank alike:
                continue        # rank 0 raises it to its caller, and the ranks stay in step
    except BaseException as exc:  # noqa: BLE001 - report anything, then exit non-zero
        code = 1
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        except Exception:  # noqa: BLE001
            pass
        traceback.print_exc()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    os._exit(code)


@contextlib.contextmanager
def _main_hidden():
    """Spawned workers import only inferlab, never the caller's script: a spawned child normally
    re-imports ``__main__`` (which fails for stdin or a notebook, and would rerun a script's
    unguarded top level, making a new LLM, and so on)."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    for k in saved:
        setattr(main, k, None) if k == "__spec__" else delattr(main, k)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


def _rendezvous() -> tuple[str, str]:
    """A file the ranks meet through (torch's FileStore): unlike a TCP port picked in advance, no
    other program can take it between picking and binding."""
    folder = tempfile.mkdtemp(prefix="inferlab-tp-")
    return folder, "file://" + os.path.join(folder, "store")


class TensorParallelExecutor:
    """Rank 0's side: starts the workers, joins the group with them, and later stops them."""

    def __init__(self, model: str, world: int, device: str, dtype, attention_backend: str, engine_config):
        if dist.is_initialized():
            gc.collect()  # an engine no one holds any more shuts its ranks down when collected
        if dist.is_initialized():
            raise TensorParallelError("this process already belongs to a torch.distributed group: shut the other "
                                      "tensor-parallel LLM down first (llm.shutdown())")
        self.world, self.dead, self.in_group = world, None, False
        self._store_dir, self._store_url = _rendezvous()
        self.spec = RankSpec(str(model), world, str(device), dtype, attention_backend, engine_config,
                             self._store_url, timeout_s())
        ctx = mp.get_context("spawn")
        self.procs, self.conns = [], []
        with _main_hidden():
            for rank in range(1, world):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=worker_main, args=(self.spec, rank, child), daemon=True,
                                name=f"inferlab-tp-rank{rank}")
                p.start()
                child.close()
                self.procs.append(p)
                self.conns.append(parent)
        try:
            self._wait_for("joining")
            try:
                self.in_group = True  # from here on, shutdown() leaves the group
                mine = setup_rank(self.spec, 0)
                self.model, self.tokenizer, self.engine_config = mine.model, mine.tokenizer, mine.engine_config
                self.num_kv_heads, self.comm = mine.num_kv_heads, mine.comm
            except RuntimeError as exc:  # a worker failed to load: its own message says why
                self._wait_for("ready")
                raise TensorParallelError(f"tensor-parallel setup failed: {exc}") from exc
            self._wait_for("ready")
        except BaseException:
            self.shutdown()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _wait_for(self, what: str) -> None:
        deadline = time.monotonic() + self.spec.timeout_s + 120  # imports and loading come first
        for rank, (p, conn) in enumerate(zip(self.procs, self.conns), start=1):
            while not conn.poll(0.05):
                if not p.is_alive() or time.monotonic() > deadline:
                    self._fail(rank, f"did not start (exit code {p.exitcode})")
            try:
                kind, detail = conn.recv()
            except EOFError:
                p.join(5)
                self._fail(rank, f"exited while starting (exit code {p.exitcode})")
            if kind == "error":
                self._fail(rank, f"failed while starting: {detail}")

    def _fail(self, rank: int, what: str):
        self.dead = (f"tensor-parallel worker rank {rank} {what}; the engine cannot continue: "
                     f"create a new LLM (its traceback, if any, is on stderr)")
        raise TensorParallelError(self.dead)

    def check_alive(self) -> None:
        if self.dead:
            raise TensorParallelError(self.dead)
        for rank, p in enumerate(self.procs, start=1):
            if not p.is_alive():
                self._fail(rank, f"exited (exit code {p.exitcode})")

    def broadcast_step(self, args: tuple, kwargs: dict) -> None:
        """Send one step's inputs to every worker (small plain data: SeqInputs, copy pairs)."""
        self.check_alive()
        for rank, conn in enumerate(self.conns, start=1):
            try:
                conn.send(("step", args, kwargs))
            except (BrokenPipeError, OSError):
                self._fail(rank, "is unreachable")

    def after_failure(self, exc: BaseException) -> None:
        """A collective failed or timed out: name the rank that died if there is one."""
        for _ in range(20):  # a killed worker may take a moment to be reaped
            for rank, p in enumerate(self.procs, start=1):
                if not p.is_alive():
                    self._fail(rank, f"exited (exit code {p.exitcode})")
            time.sleep(0.05)
        self.dead = (f"a tensor-parallel collective failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                     "the engine cannot continue: create a new LLM")
        raise TensorParallelError(self.dead) from exc

    def attach(self, engine) -> None:
        """Run each step of ``engine`` (built over rank 0's shard) on every rank: its runner becomes
        a :class:`ParallelRunner`. The workers live as long as the engine (a server keeps the
        engine and drops the LLM)."""
        engine.runner = ParallelRunner(engine.runner, self)
        weakref.finalize(engine, self.shutdown)

    def shutdown(self) -> None:
        """Stop the workers (politely, then by force) and leave the group. Safe to call twice."""
        for conn in self.conns:
            try:
                conn.send(("exit",))
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(2)
            if p.is_alive():
                p.kill()
                p.join()
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        if self.in_group and dist.is_initialized():  # ours, not a later LLM's
            dist.destroy_process_group()
        self.in_group = False
        shutil.rmtree(self._store_dir, ignore_errors=True)
        self.dead = self.dead or "this tensor-parallel LLM was shut down: create a new LLM"


class ParallelRunner:
    """Rank 0's model runner: sends each step to the workers, then runs its own ``ModelRunner``.

    It shows what a ``ModelRunner`` shows (its model, KV cache, block size and device: rank 0's)
    and, beside them, rank 0's collectives with their counters."""

    def __init__(self, runner, executor: TensorParallelExecutor):
        self.runner, self.executor = runner, executor

    @property
    def model(self) -> torch.nn.Module:
        return self.runner.model

    @property
    def kv_cache(self):
        return self.runner.kv_cache

    @property
    def block_size(self) -> int:
        return self.runner.block_size

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def comm(self) -> Collectives:
        return self.executor.comm

    def execute(self, *args, **kwargs):
        self.executor.broadcast_step(args, kwargs)
        try:
            return self.runner.execute(*args, **kwargs)
        except RuntimeError as exc:  # gloo/NCCL: a peer closed the connection or the timeout passed
            self.executor.after_failure(exc)
