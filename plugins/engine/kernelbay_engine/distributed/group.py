"""`TensorParallelGroup`: the torch.distributed process group of one tensor-parallel engine, and the collectives its
sharded layers and its driver call. Passed explicitly to every layer that communicates (no module-level state).

Two groups over the same ranks: `compute` (the layers' all-reduces and gathers) waits at most `timeout_s`, so a rank
that hangs fails the step instead of hanging it; `control` (the driver's broadcast of each step) waits as long as the
engine stays idle. A rank that dies closes its connections, which fails the others' next collective at once. Before
it exits, a rank that raised writes its cause to the group's TCP store (`failure/<rank>`), where the driver reads it.
"""

from __future__ import annotations

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
    """This process's rank in the group, the TCP store and the two process groups (see the module docstring)."""

    def __init__(self, parallel: ParallelConfig, store, compute, control, backend: str):
        self.parallel = parallel
        self.store = store
        self.compute = compute
        self.control = control
        self.backend = backend

    @classmethod
    def join(
        cls,
        parallel: ParallelConfig,
        rendezvous: Rendezvous,
        *,
        device: str = "cpu",
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> TensorParallelGroup:
        """Join (rank 0: host) the group; gloo on CPU, NCCL on CUDA."""
        backend = "nccl" if device.startswith("cuda") else "gloo"
        timeout = timedelta(seconds=timeout_s)
        if rendezvous.host is None:  # torchrun: its environment names the store
            dist.init_process_group(backend, timeout=timeout)
            store = _store_of_env(parallel, timeout)
        else:
            assert rendezvous.port is not None
            store = dist.TCPStore(
                rendezvous.host, rendezvous.port, parallel.world_size, parallel.is_driver, timeout=timeout
            )
            dist.init_process_group(
                backend, store=store, rank=parallel.rank, world_size=parallel.world_size, timeout=timeout
            )
        ranks = list(range(parallel.world_size))
        compute = dist.new_group(ranks, timeout=timeout, backend=backend)
        control = dist.new_group(ranks, timeout=_IDLE, backend="gloo")
        return cls(parallel, store, compute, control, backend)

    # -- what the sharded layers call -----------------------------------------------------------------
    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over the ranks, in place (it must be contiguous); returns it."""
        dist.all_reduce(t, group=self.compute)
        return t

    def all_gather_last(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's `t` [..., n] side by side on the last axis: [..., world_size * n]."""
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.parallel.world_size)]
        dist.all_gather(parts, t, group=self.compute)
        return torch.cat(parts, dim=-1)

    # -- what the driver and the workers call ---------------------------------------------------------
    def broadcast(self, message: object = None) -> object:
        """The driver's `message` on every rank (the driver passes it, the others receive it)."""
        box = [message]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def gather(self, report: object) -> list[object] | None:
        """Every rank's `report`, on the driver (None elsewhere)."""
        reports: list[object] | None = [None] * self.parallel.world_size if self.parallel.is_driver else None
        dist.gather_object(report, reports, dst=0, group=self.control)
        return reports

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

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _store_of_env(parallel: ParallelConfig, timeout: timedelta):
    """torchrun's rendezvous store, prefixed as init_process_group's default group uses it."""
    import os

    return dist.PrefixStore(
        "kernelbay/",
        dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), parallel.world_size, False, timeout=timeout
        ),
    )
