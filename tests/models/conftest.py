"""Session-scoped tiny checkpoints: each transformers model is built once (fixed seed) and saved once.

Shared with the model tests of kernelbay-engine, kernelbay-llama and kernelbay-deepseek (plugins/<name>/tests/),
whose conftests import these fixtures."""

from __future__ import annotations

import pytest
import torch
import transformers

from kernelbay_engine import AutoModelForCausalLM

from ._tiny import TINY, Tiny


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """The CI machine has two shared cores: threads only add contention for models this small."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def perturb_(model: torch.nn.Module, seed: int = 0) -> None:
    """Noise on every saved tensor (weights, biases, norms, router biases), so that each of them matters."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in model.state_dict(keep_vars=True).values():  # persistent only: not Gemma's embed_scale
            if tensor.is_floating_point():
                tensor.add_(torch.randn(tensor.shape, generator=gen, dtype=tensor.dtype) * 0.05)


def build_reference(name: str, seed: int = 0, tiny: Tiny | None = None) -> transformers.PreTrainedModel:
    """`tiny`: a plugin's own tiny config (plugins keep theirs beside their tests); default: `TINY[name]`."""
    torch.manual_seed(seed)
    config = (tiny or TINY[name]).build()
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    perturb_(model, seed)
    return model.eval()


class TinyCheckpoints:
    """`get(name[, tiny])` -> (folder, transformers model); built on first request, kept for the session."""

    def __init__(self, root):
        self.root = root
        self._cache: dict[str, tuple] = {}

    def get(self, name: str, tiny: Tiny | None = None):
        if name not in self._cache:
            model = build_reference(name, tiny=tiny)
            folder = self.root / name
            model.save_pretrained(folder)
            self._cache[name] = (folder, model)
        return self._cache[name]


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> TinyCheckpoints:
    return TinyCheckpoints(tmp_path_factory.mktemp("tiny-checkpoints"))


@pytest.fixture(scope="module")
def loaded(tiny_checkpoints):
    """name -> (transformers model, kernelbay model), each kernelbay model loaded once per module."""
    cache = {}

    def get(name, tiny: Tiny | None = None):
        if name not in cache:
            folder, hf_model = tiny_checkpoints.get(name, tiny)
            cache[name] = (hf_model, AutoModelForCausalLM.from_pretrained(folder, progress=False))
        return cache[name]

    return get


@pytest.fixture(scope="module")
def loaded_moe(tiny_checkpoints):
    """(name, MoE backend) -> (transformers model, kernelbay model loaded with that MoE kernel), once per module: a
    kernel that repacks the experts holds their only copy, so each kernel gets its own load."""
    cache = {}

    def get(name, moe_backend: str, tiny: Tiny | None = None):
        if (name, moe_backend) not in cache:
            folder, hf_model = tiny_checkpoints.get(name, tiny)
            model = AutoModelForCausalLM.from_pretrained(folder, progress=False, moe_backend=moe_backend)
            cache[name, moe_backend] = (hf_model, model)
        return cache[name, moe_backend]

    return get
