"""The embedded demo checkpoint: complete, small, a valid GQA Llama, and it speaks fortune-cookie English."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PreTrainedTokenizerFast

import kernelbay_engine

DEMO_DIR = Path(kernelbay_engine.__file__).parent / "demo"
CORPUS_WORDS = Path(__file__).with_name("corpus_words.txt")
REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "README.md",
    "LICENSE.fortunes",
)
MAX_FOLDER_BYTES = 8 * 1024 * 1024
ROUND_TRIP_TEXTS = (
    "A day for firm decisions!!!!!  Or is it?",
    "A banker is a fellow who lends you his umbrella\nwhen the sun is shining.\n\t\t-- Mark Twain",
    "  leading spaces, trailing spaces  ",
    "Unicode survives: naïve café, 東京, emoji 🙂, math ∑.",
    "",
)


@pytest.fixture(scope="session")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEMO_DIR)


@pytest.fixture(scope="session")
def model():
    return AutoModelForCausalLM.from_pretrained(DEMO_DIR, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def corpus_words() -> frozenset[str]:
    return frozenset(CORPUS_WORDS.read_text(encoding="utf-8").split())


def test_folder_has_every_file_and_stays_small():
    """All checkpoint files ship inside the kernelbay_engine package and the folder stays under 8 MiB."""
    missing = [name for name in REQUIRED_FILES if not (DEMO_DIR / name).is_file()]
    assert not missing, f"{DEMO_DIR} lacks {missing}; rebuild with examples/make_demo_checkpoint.py"
    total = sum(p.stat().st_size for p in DEMO_DIR.iterdir() if p.is_file())
    assert total <= MAX_FOLDER_BYTES, f"demo folder is {total / 2**20:.1f} MiB, over 8 MiB"
    assert (DEMO_DIR / "model.safetensors").stat().st_size > 1_000_000, "weights look truncated"


def test_config_is_a_gqa_llama_with_tied_embeddings(tokenizer):
    """config.json is a valid LlamaForCausalLM config whose geometry matches the tokenizer."""
    raw = json.loads((DEMO_DIR / "config.json").read_text())
    config = AutoConfig.from_pretrained(DEMO_DIR)
    assert raw["architectures"] == ["LlamaForCausalLM"]
    assert isinstance(config, LlamaConfig)
    assert config.num_key_value_heads < config.num_attention_heads, "demo should exercise GQA"
    assert config.hidden_size // config.num_attention_heads == config.head_dim == 64
    assert config.tie_word_embeddings
    assert config.vocab_size == len(tokenizer)
    assert (config.bos_token_id, config.eos_token_id) == (tokenizer.bos_token_id, tokenizer.eos_token_id)


def test_weights_cover_every_parameter_but_the_tied_head():
    """model.safetensors holds exactly the config's parameters (lm_head is tied), with their shapes."""
    config = AutoConfig.from_pretrained(DEMO_DIR)
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()}
    expected.pop("lm_head.weight")
    with safe_open(DEMO_DIR / "model.safetensors", framework="pt") as weights:
        stored = {k: tuple(weights.get_slice(k).get_shape()) for k in weights.keys()}
    assert stored == expected


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_tokenizer_round_trips_exactly(tokenizer, text):
    """decode(encode(x)) == x for the byte-level BPE, with <|bos|> prepended to every input."""
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id == 1
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_tokenizer_loads_as_a_fast_tokenizer_with_its_special_tokens():
    """PreTrainedTokenizerFast loads the folder directly and knows pad/bos/eos as ids 0/1/2."""
    fast = PreTrainedTokenizerFast.from_pretrained(DEMO_DIR)
    assert (fast.pad_token, fast.bos_token, fast.eos_token) == ("<|pad|>", "<|bos|>", "<|eos|>")
    assert (fast.pad_token_id, fast.bos_token_id, fast.eos_token_id) == (0, 1, 2)
    assert 2000 <= len(fast) <= 4096


def test_greedy_generation_prints_corpus_words(model, tokenizer, corpus_words):
    """16 greedy tokens from a prompt decode to several real words from the training corpus."""
    inputs = tokenizer("A computer is", return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    text = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    words = [w.lower() for w in re.findall(r"[A-Za-z]+", text) if len(w) >= 3]
    known = [w for w in words if w in corpus_words]
    assert len(known) >= 6 and len(known) >= 0.75 * len(words), f"not English enough: {text!r}"


def test_readme_names_corpus_licence_and_rebuild_command():
    """README.md says what the model is, where its text comes from, its licence and how to rebuild it."""
    readme = (DEMO_DIR / "README.md").read_text(encoding="utf-8")
    for needle in (
        "LlamaForCausalLM",
        "fortunes",
        "BSD",
        "LICENSE.fortunes",
        "python examples/make_demo_checkpoint.py --out plugins/engine/kernelbay_engine/demo",
        "held-out loss",
    ):
        assert needle in readme, f"README.md no longer mentions {needle!r}"
    assert "Regents of the University of California" in (DEMO_DIR / "LICENSE.fortunes").read_text()


def test_corpus_word_list_is_sorted_lowercase_words():
    """The shipped word list is what the script writes: sorted, unique, lower-case, 3+ letters."""
    words = CORPUS_WORDS.read_text(encoding="utf-8").split()
    assert words == sorted(set(words)) and 1000 <= len(words) <= 5000
    assert all(re.fullmatch(r"[a-z]{3,}", w) for w in words)
