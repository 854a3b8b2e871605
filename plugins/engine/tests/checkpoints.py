"""Tiny checkpoints built with transformers for the engine and CLI tests."""

from __future__ import annotations

from pathlib import Path

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
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    fast.save_pretrained(str(folder))


def build_tiny_llama(folder: Path, *, seed: int = 0, **overrides) -> Path:
    """Random fp32 Llama with GQA; weights scaled up so greedy choices are not near-ties."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    options = dict(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.3,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    options.update(overrides)
    model = LlamaForCausalLM(LlamaConfig(**options)).to(torch.float32).eval()
    model.save_pretrained(str(folder))
    train_tokenizer(folder)
    return folder


def build_tiny_model(folder: Path, config, *, seed: int = 0) -> Path:
    """A random fp32 transformers model of `config` (any family) saved as safetensors, without a tokenizer (prompts
    are token ids); give the config a large initializer_range so greedy choices are not near-ties."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    model.save_pretrained(str(folder))
    return folder
