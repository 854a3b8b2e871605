"""kernelbay-cpu: native CPU kernels.

- `CPU_PAGED` (`kernelbay_cpu.attention:CpuPagedBackend`): one native call writes a step's keys and values into the
  paged cache and attends every query of up to a few tokens a request (decode, speculative verify); longer prompts
  go to torch's SDPA.
- `kernelbay_cpu.build`: how a kernelbay plugin builds and loads its C++ ops with torch (cached per machine).

Backends are found through the `kernelbay.attention_backends` entry points; importing this package imports none
of them.
"""
