"""A tiny random Llama checkpoint (transformers-built, safetensors) with a locally trained tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a fortune cookie says you will write many tests",
    "kernelbay runs models over a paged cache of keys and values",
    "continuous batching lets new requests join while others decode",
    "greedy decoding always picks the most likely next token",
] * 20


def train_tokenizer(folder: Path) -> None:
    """A byte-level BPE (vocab <= 300) saved with a tokenizer_config, as transformers expects."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<bos>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    fast.save_pretrained(str(folder))


def build_tiny_llama(folder: Path, *, seed: int = 0, **overrides) -> Path:
    """Random fp32 Llama with GQA; weights scaled up so greedy choices are not near-ties."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    options = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                   initializer_range=0.3, bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    options.update(overrides)
    model = LlamaForCausalLM(LlamaConfig(**options)).to(torch.float32).eval()
    model.save_pretrained(str(folder))
    train_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """Folder of a tiny random Llama: config.json, model.safetensors, tokenizer files."""
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def hf_tiny_llama(tiny_llama):
    """The same checkpoint loaded by transformers (the reference)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32).eval()


_LLMS: dict = {}


@pytest.fixture(scope="session")
def make_llm(tiny_llama):
    """LLM(tiny_llama, **options), built once per distinct option set in the session."""
    from kernelbay import LLM

    def make(**options):
        key = tuple(sorted(options.items()))
        if key not in _LLMS:
            _LLMS[key] = LLM(tiny_llama, progress=False, **options)
        return _LLMS[key]

    return make


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """Tiny matmuls on a shared 2-core machine run faster (and steadier) on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
