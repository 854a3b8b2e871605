"""The driver's side of a tensor-parallel engine: start the ranks, broadcast each step, fail loudly, shut down.

The driver is rank 0: it keeps the scheduler (one block ledger), holds its own shard and samples from the gathered
logits. `TensorParallelRunner` is a `ModelRunner` over rank 0's shard that first broadcasts each step to the other
ranks. With `torch.multiprocessing` (spawn) the driver starts ranks 1..N-1 itself; under `torchrun` they are already
running (`serve_rank`). Any failure of a step (a rank that died or raised, a collective past its timeout) fails the
requests with a `TensorParallelFailure` naming the rank and cause, and shuts every rank down: later calls get the
same error.
"""

from __future__ import annotations

import os
import signal
import socket
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from kernelbay.errors import KernelbayError
from kernelbay_engine.distributed.group import DEFAULT_TIMEOUT_S, Rendezvous, TensorParallelGroup
from kernelbay_engine.distributed.parallel import ParallelConfig
from kernelbay_engine.distributed.protocol import Allocate, GatherEmbedding, RankReport, Step, Stop
from kernelbay_engine.distributed.worker import WorkerSpec, build_rank_runner, rank_report
from kernelbay_engine.runner import ModelRunner

_JOIN_S = 10.0  # how long a stopping rank may take before it is killed


class TensorParallelFailure(KernelbayError, RuntimeError):
    """A rank of a tensor-parallel engine died, raised or timed out; the message names the rank and the cause. The
    engine is shut down (every rank stopped): make a new LLM."""


class TensorParallelEngine:
    """The group seen from the driver: the worker processes it started (none under torchrun) and their reports."""

    def __init__(self, group: TensorParallelGroup, context=None):
        self.group = group
        self.context = context  # torch.multiprocessing's ProcessContext of ranks 1..N-1 (None under torchrun)
        self.reports: list[RankReport] = []
        self.failure: TensorParallelFailure | None = None
        self.closed = False

    @property
    def world_size(self) -> int:
        return self.group.parallel.world_size

    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.context.processes] if self.context is not None else []

    def send(self, message) -> None:
        with self.failures("broadcasting a step"):
            self.group.broadcast(message)

    @contextmanager
    def failures(self, doing: str) -> Iterator[None]:
        """Whatever fails inside (on any rank) shuts the engine down and is raised as a TensorParallelFailure."""
        if self.failure is not None:
            raise self.failure
        if self.closed:
            raise TensorParallelFailure("this tensor-parallel engine was shut down (runner.shutdown()); make a new LLM")
        try:
            yield
        except BaseException as err:
            remote = self._remote_cause()
            rank, cause = remote if remote is not None else (0, f"{type(err).__name__}: {err}"[:2000])
            self.failure = TensorParallelFailure(
                f"tensor-parallel rank {rank}{' (the driver)' * (rank == 0)} failed while {doing}: {cause}; "
                "every rank was shut down (make a new LLM)"
            )
            self.shutdown(kill=True)
            if remote is None and isinstance(err, (KernelbayError, KeyboardInterrupt)):
                raise  # the driver's own error (a bad checkpoint, a failing backend, Ctrl-C) keeps its class
            raise self.failure from err

    def _remote_cause(self) -> tuple[int, str] | None:
        """(rank, cause) of the first other rank that reported a failure or whose process ended."""
        for rank in range(1, self.world_size):
            cause = self.group.failure_of(rank) or self._exit_cause(rank)
            if cause:
                return rank, cause
        return None

    def _exit_cause(self, rank: int) -> str | None:
        if self.context is None:
            return None
        process = self.context.processes[rank - 1]
        process.join(timeout=1.0)  # a rank that died needs a moment to be reaped
        code = process.exitcode
        if code is None:
            return None
        if code < 0:
            return f"its process (pid {process.pid}) was killed by {signal.Signals(-code).name}"
        return f"its process (pid {process.pid}) exited with code {code}"

    def shutdown(self, *, kill: bool = False) -> None:
        """Stop every rank (broadcast Stop when healthy; kill when not), reap the processes, leave the group."""
        if self.closed:
            return
        self.closed = True
        if not kill:
            try:
                self.group.broadcast(Stop())
                self.group.barrier()
            except Exception:  # noqa: BLE001 - a rank already gone: kill the rest below
                kill = True
        for process in self.context.processes if self.context is not None else []:
            if kill and process.is_alive():
                process.kill()
            process.join(timeout=_JOIN_S)
            if process.is_alive():
                process.kill()
                process.join()
        self.group.close(abort=kill)


class TensorParallelRunner(ModelRunner):
    """`ModelRunner` over rank 0's shard that broadcasts every step (and the cache allocation) to the other ranks."""

    engine: TensorParallelEngine
    file_codes: dict[str, str]
    """quantization="gguf": rank 0's layer path -> what it runs on its share of the file's codes ({} otherwise)."""

    def allocate_cache(self, num_blocks: int) -> None:
        self.engine.send(Allocate(num_blocks))
        with self.engine.failures("allocating the KV cache"):
            super().allocate_cache(num_blocks)

    def step_with_all_logits(self, requests, every_position):
        self.engine.send(Step(tuple(requests), tuple(every_position)))
        with self.engine.failures(f"running engine step {self.steps + 1}"):
            return super().step_with_all_logits(requests, every_position)

    def whole_input_embeddings(self):
        """The target's whole token table, gathered from every rank's vocabulary rows: rank 0's own table is a share
        whose lookups sum over the ranks in a collective, which a draft on the driver cannot call alone."""
        from kernelbay_engine.distributed.layers import whole_embedding

        self.engine.send(GatherEmbedding())
        with self.engine.failures("gathering the token table for the draft model"):
            return whole_embedding(self.model)

    @property
    def reports(self) -> list[RankReport]:
        """Every rank's report (rank order): its weight and KV shares, kernels, registry."""
        return self.engine.reports

    def shutdown(self) -> None:
        """Stop every rank now (also done when the runner is collected, or at exit)."""
        self.engine.shutdown()


def start_tensor_parallel(
    folder, n: int, options: dict, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> TensorParallelRunner:
    """Start (spawn) or join (torchrun) `n` ranks and load every shard; returns rank 0's runner (the driver's)."""
    torchrun = torchrun_rank()
    if torchrun is not None and int(os.environ["WORLD_SIZE"]) != n:
        from kernelbay_engine.args import EngineArgumentError

        raise EngineArgumentError(
            f"tensor_parallel_size={n} but torchrun started {os.environ['WORLD_SIZE']} processes; give them the same N"
        )
    if torchrun is None:
        spec = WorkerSpec(
            str(folder), n, Rendezvous("127.0.0.1", _free_port()), timeout_s, options, _handoff(), _threads(n)
        )
        context = _spawn(spec, n)
    else:
        spec = WorkerSpec(str(folder), n, Rendezvous(), timeout_s, options, None, _threads(n))
        context = None
        if torchrun != 0:
            from kernelbay_engine.distributed.worker import serve_rank

            serve_rank(spec, ParallelConfig(n, torchrun))
            raise SystemExit(0)  # a torchrun rank > 0 serves the driver's steps, then its script ends here
    return _drive(spec, n, context)


def _drive(spec: WorkerSpec, n: int, context) -> TensorParallelRunner:
    engine = None
    try:
        group = TensorParallelGroup.join(ParallelConfig(n, 0), spec.rendezvous, timeout_s=spec.timeout_s)
        engine = TensorParallelEngine(group, context)
        with engine.failures("loading the model"):
            runner, shards = build_rank_runner(spec, group, TensorParallelRunner)
            runner.engine, runner.file_codes = engine, shards.file_codes
            engine.reports = group.gather(rank_report(runner, shards))  # type: ignore[assignment]
    except BaseException:
        if engine is None and context is not None:
            for process in context.processes:
                process.kill()
        raise
    weakref.finalize(runner, engine.shutdown)
    return runner


def torchrun_rank() -> int | None:
    """This process's rank in a torchrun launch (RANK, WORLD_SIZE and MASTER_ADDR set), else None."""
    if all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return int(os.environ["RANK"])
    return None


def _spawn(spec: WorkerSpec, n: int):
    import torch.multiprocessing as mp

    from kernelbay_engine.distributed.worker import spawn_entry

    return mp.start_processes(spawn_entry, args=(spec,), nprocs=n - 1, join=False, daemon=True, start_method="spawn")


def _handoff() -> dict:
    from kernelbay_engine.distributed.handoff import registry_handoff

    return registry_handoff()


def _threads(n: int) -> int:
    """Each rank's share of the machine's cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // n)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
