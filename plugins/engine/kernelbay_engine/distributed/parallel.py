"""`ParallelConfig`: which rank of how many this process is; the one record sharded layers are built from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """Tensor parallelism over `world_size` ranks; this process is `rank` (0 is the driver: it owns the scheduler)."""

    world_size: int = 1
    rank: int = 0

    def __post_init__(self):
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not one of the {self.world_size} ranks; ranks are 0..world_size-1")

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def block(self, full: int, local: int) -> int:
        """Which `local`-sized block of a `full`-sized axis this rank holds: its own when the axis splits N ways,
        rank // (N / blocks) when there are fewer blocks than ranks (GQA: a KV head replicated on several ranks)."""
        blocks = full // local
        if full % local or (self.world_size % blocks and blocks % self.world_size):
            raise ValueError(f"an axis of {full} does not split into blocks of {local} over {self.world_size} ranks")
        return self.rank * blocks // self.world_size if blocks <= self.world_size else self.rank

    def padded_share(self, size: int) -> int:
        """Rows each rank holds of an axis of `size` split evenly, the last rank padded (a vocabulary)."""
        return -(-size // self.world_size)
