"""Tensor and expert parallelism on torch.distributed: `LLM(..., tensor_parallel_size=N)`.

- `parallel`: `ParallelConfig`, a rank's place (the record sharded layers are built from);
- `sizes`: what N can shard (refused before loading, with reasons) and a rank's per-rank config;
- `group`: `TensorParallelGroup`, the process group and collectives (gloo on CPU, NCCL on CUDA), with timeouts;
- `layers`: row-parallel, vocabulary-parallel and expert-parallel combination of the ranks' shares;
- `sharding`: which slice of each checkpoint tensor a rank reads and how its layers combine;
- `load`: a rank's model, built on meta and filled with its slices only;
- `handoff`: a worker's registry, rebuilt lazily from the parent's exported providers;
- `worker` / `engine`: the worker loop, and the driver (rank 0: scheduler, sampling, failures, shutdown).
"""

from kernelbay_engine.distributed.engine import TensorParallelFailure, TensorParallelRunner, start_tensor_parallel
from kernelbay_engine.distributed.parallel import ParallelConfig

__all__ = ["ParallelConfig", "TensorParallelFailure", "TensorParallelRunner", "start_tensor_parallel"]
