"""The pieces of examples/make_demo_checkpoint.py, on tiny inputs (no apt, no real training)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[4] / "examples" / "make_demo_checkpoint.py"


@pytest.fixture(scope="module")
def maker():
    spec = importlib.util.spec_from_file_location("make_demo_checkpoint", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def write_fake_package(root: Path, maker, fortunes_per_file: int) -> None:
    """An unpacked-package tree with every allow-listed fortune file and the copyright file."""
    fortune_dir = root / maker.FORTUNE_DIR
    fortune_dir.mkdir(parents=True)
    for name in maker.FORTUNE_FILES:
        body = "\n%\n".join(f"{name} saying number {i}.\n\t\t-- Someone" for i in range(fortunes_per_file))
        (fortune_dir / name).write_text(body + "\n%\n", encoding="utf-8")
    (root / maker.COPYRIGHT_FILE).parent.mkdir(parents=True)
    (root / maker.COPYRIGHT_FILE).write_text("BSD, Regents of the University of California\n")


def test_clean_fortune_drops_overstrikes_and_collapses_blanks(maker):
    """nroff overstrikes vanish and runs of blanks/tabs become one space; line breaks stay."""
    assert maker.clean_fortune("B\x08Bold  and\t\tplain \n\t\t-- Author\n") == "Bold and plain\n -- Author"


def test_read_fortune_file_splits_on_percent_lines(maker, tmp_path):
    """Only a line holding just `%` separates fortunes; a `%` inside text does not."""
    path = tmp_path / "f"
    path.write_text("One.\n%\n100% sure.\nTwo lines.\n%\n\n%\n", encoding="utf-8")
    assert maker.read_fortune_file(path) == ["One.", "100% sure.\nTwo lines."]


def test_load_corpus_reads_every_listed_file(maker, tmp_path):
    """Every allow-listed file contributes its fortunes, counted per file, with a stable digest."""
    write_fake_package(tmp_path, maker, fortunes_per_file=40)
    corpus = maker.load_corpus(tmp_path)
    assert set(corpus.per_file) == set(maker.FORTUNE_FILES)
    assert len(corpus.fortunes) == 40 * len(maker.FORTUNE_FILES)
    assert corpus.sha256 == maker.load_corpus(tmp_path).sha256
    assert "Regents" in corpus.copyright


def test_load_corpus_rejects_a_truncated_package(maker, tmp_path):
    """Too few fortunes is an error that says to clear the cache."""
    write_fake_package(tmp_path, maker, fortunes_per_file=2)
    with pytest.raises(ValueError, match="delete the cache dir"):
        maker.load_corpus(tmp_path)


def test_failed_packaging_command_says_what_to_do(maker, tmp_path):
    """A failing apt/dpkg command exits with its stderr and the apt-get update hint."""
    with pytest.raises(SystemExit, match="apt-get update"):
        maker.run_checked(["false"], cwd=tmp_path)


def test_tokenizer_round_trips_and_prepends_bos(maker):
    """The trained byte-level BPE reproduces text exactly, even bytes it never saw in training."""
    texts = tuple(f"The cat sat on mat number {i}, happily." for i in range(200))
    tokenizer = maker.train_tokenizer(texts, vocab_size=300)
    maker.check_round_trip(tokenizer, (*texts[:5], "Ünïcödé ✓ and\ttabs\n"))
    stream = maker.encode_stream(tokenizer, texts[:3])
    assert stream[0].item() == tokenizer.bos_token_id and stream[-1].item() == tokenizer.eos_token_id
    assert (stream == tokenizer.bos_token_id).sum().item() == 3


@pytest.mark.parametrize(
    "field, value", [("steps", 0), ("batch_size", 0), ("minutes", 0.0), ("warmup", 5000), ("lr", 2.0)]
)
def test_train_settings_reject_bad_values_naming_the_flag(maker, field, value):
    """Each bad training setting is refused with the command-line flag to change."""
    with pytest.raises(ValueError, match=f"--{field.replace('_', '-')}"):
        maker.TrainSettings(**{field: value})


def test_learning_rate_warms_up_then_decays_to_a_tenth(maker):
    """lr rises linearly to the peak during warmup, then decays by cosine to 10% of it."""
    settings = maker.TrainSettings(steps=100, warmup=10, lr=1e-3)
    assert maker.lr_at(0, settings) == pytest.approx(1e-4)
    assert maker.lr_at(10, settings) == pytest.approx(1e-3)
    assert maker.lr_at(100, settings) == pytest.approx(1e-4)
    assert all(maker.lr_at(s, settings) >= maker.lr_at(s + 1, settings) for s in range(10, 100))


def test_short_build_saves_a_folder_transformers_reloads(maker, tmp_path):
    """A 2-step training run saves weights and tokenizer that load back with the same outputs."""
    texts = tuple(f"Fortune {i}: you will meet a tall stranger." for i in range(300))
    tokenizer = maker.train_tokenizer(texts, vocab_size=300)
    settings = maker.TrainSettings(steps=2, warmup=1, batch_size=2, seq_len=16, threads=1)
    model, losses, _ = maker.train_model(maker.encode_stream(tokenizer, texts), len(tokenizer), settings)
    assert len(losses) == 2
    maker.write_checkpoint(tmp_path, model, tokenizer, "float32")
    reloaded, reloaded_tokenizer = maker.reload(tmp_path)
    ids = reloaded_tokenizer("Fortune 7:", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, model.eval()(input_ids=ids).logits)
