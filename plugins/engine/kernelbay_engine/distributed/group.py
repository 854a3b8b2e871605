"""`TensorParallelGroup`: the process groups of one tensor-parallel engine and the collectives its sharded layers and
its driver call. Passed explicitly to every layer that communicates: no torch.distributed default group, no module
state, so one process may hold several engines.

Two groups over the same ranks and TCP store: `compute` (the layers' all-reduces and gathers) waits at most
`timeout_s`, so a rank that hangs fails the step instead of hanging it; `control` (the driver's broadcast of each step)
waits as long as the engine stays idle. A rank that dies closes its connections, which fails the others' next
collective at once. A rank that raised writes its cause to the store (`failure/<rank>`) before it exits, where the
driver reads it.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from kernelbay_engine.distributed.parallel import ParallelConfig

DEFAULT_TIMEOUT_S = 120.0
_IDLE = timedelta(days=365)  # the control group waits for the next step as long as the engine is idle


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """Where the ranks meet: the driver's TCP store (host, port); torchrun's `MASTER_ADDR`/`MASTER_PORT` when None."""

    host: str | None = None
    port: int | None = None


class TensorParallelGroup:
    """This process's rank, the TCP store and the two process groups (see the module docstring)."""

    def __init__(self, parallel: ParallelConfig, store, compute, control):
        self.parallel = parallel
        self.store = store
        self.compute = compute
        self.control = control

    @classmethod
    def join(
        cls,
        parallel: ParallelConfig,
        rendezvous: Rendezvous,
        *,
        device: str = "cpu",
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> TensorParallelGroup:
        """Join (rank 0 of a spawned engine: host) the group; gloo on CPU, NCCL on CUDA."""
        timeout = timedelta(seconds=timeout_s)
        if rendezvous.host is None:  # torchrun: its agent's store, under a prefix of ours
            host, port, hosting = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), False
        else:
            assert rendezvous.port is not None
            host, port, hosting = rendezvous.host, rendezvous.port, parallel.is_driver
        tcp = dist.TCPStore(host, port, parallel.world_size, hosting, timeout=timeout, wait_for_workers=False)
        store = dist.PrefixStore("kernelbay/", tcp)
        compute = _process_group(dist.PrefixStore("compute/", store), parallel, device, timeout)
        control = dist.ProcessGroupGloo(dist.PrefixStore("control/", store), parallel.rank, parallel.world_size, _IDLE)
        return cls(parallel, store, compute, control)

    # -- what the sharded layers call -----------------------------------------------------------------
    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over the ranks, in place (it must be contiguous); returns it."""
        self.compute.allreduce([t]).wait()
        return t

    def all_gather_last(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's `t` [..., n] side by side on the last axis: [..., world_size * n]."""
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.parallel.world_size)]
        self.compute.allgather([parts], [t]).wait()
        return torch.cat(parts, dim=-1)

    # -- what the driver and the workers call ---------------------------------------------------------
    def broadcast(self, message: object = None) -> object:
        """The driver's `message` on every rank (the driver passes it, the others receive it)."""
        data = pickle.dumps(message) if self.parallel.is_driver else b""
        size = torch.tensor([len(data)], dtype=torch.long)
        self.control.broadcast([size], _root()).wait()
        buffer = _bytes_tensor(data) if self.parallel.is_driver else torch.empty(int(size), dtype=torch.uint8)
        self.control.broadcast([buffer], _root()).wait()
        return message if self.parallel.is_driver else pickle.loads(buffer.numpy().tobytes())

    def gather(self, report: object) -> list[object]:
        """Every rank's `report`, in rank order, on every rank."""
        data = pickle.dumps(report)
        n = self.parallel.world_size
        sizes = [torch.zeros(1, dtype=torch.long) for _ in range(n)]
        self.control.allgather([sizes], [torch.tensor([len(data)], dtype=torch.long)]).wait()
        longest = max(int(s) for s in sizes)
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[: len(data)] = _bytes_tensor(data)
        parts = [torch.empty(longest, dtype=torch.uint8) for _ in range(n)]
        self.control.allgather([parts], [padded]).wait()
        return [pickle.loads(p[: int(s)].numpy().tobytes()) for p, s in zip(parts, sizes, strict=True)]

    def report_failure(self, cause: str) -> None:
        """Leave this rank's cause where the driver looks (best effort: the store may be gone with the driver)."""
        try:
            self.store.set(f"failure/{self.parallel.rank}", cause)
        except Exception:  # noqa: BLE001 - the driver is gone: nobody to tell
            pass

    def failure_of(self, rank: int) -> str | None:
        """The cause rank `rank` left in the store, if any."""
        key = f"failure/{rank}"
        try:
            return self.store.get(key).decode() if self.store.check([key]) else None
        except Exception:  # noqa: BLE001 - a store that cannot answer knows nothing
            return None

    def barrier(self) -> None:
        """Wait until every rank is here: after Stop, so that no rank closes its connections while another is still
        reading the last message (a torchrun rank 0 tearing down mid-read aborted with std::terminate)."""
        self.control.barrier().wait()

    def close(self, *, abort: bool = False) -> None:
        """Leave both groups: `shutdown` after a clean stop (every rank past the last barrier), `abort` when a rank
        failed or hangs (a rank still waiting on this one fails at once); then drop them, so their C++ objects are
        destroyed here: destroyed during the interpreter's exit, they sometimes killed a torchrun rank 0 with
        std::terminate ("terminate called without an active exception") after its last output."""
        for pg in (self.compute, self.control):
            try:
                pg.abort() if abort else pg.shutdown()
            except Exception:  # noqa: BLE001 - already broken: nothing left to close
                pass
        self.compute = self.control = None


def _process_group(store, parallel: ParallelConfig, device: str, timeout: timedelta):
    if device.startswith("cuda"):
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, parallel.rank, parallel.world_size, options)
    return dist.ProcessGroupGloo(store, parallel.rank, parallel.world_size, timeout)


def _root() -> dist.BroadcastOptions:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    return options


def _bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
