"""Rebuild kernelbay's embedded demo checkpoint: a tiny Llama trained on Debian's fortune cookies.

    python examples/make_demo_checkpoint.py --out plugins/engine/kernelbay_engine/demo

Steps, all local (no model hub):
1. fetch the `fortunes-min` and `fortunes` Debian packages with `apt-get download` (nothing is
   installed; the .debs are unpacked with `dpkg-deb -x` into a cache dir) and read their
   English fortune files;
2. train a byte-level BPE tokenizer on them with `tokenizers`;
3. train a ~3M-parameter `LlamaForCausalLM` (GQA, tied embeddings) on CPU for a fixed number
   of steps (capped by --minutes of wall time);
4. write a Hugging Face folder (config, safetensors weights, tokenizer, README with the loss
   and sample generations) and the word list the demo test checks generations against.

Same seed, steps and thread count give the same weights.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

# --- corpus ------------------------------------------------------------------------------

DEBIAN_VERSION = "1:1.99.1-7.3"  # Debian 12 "bookworm"; pinned so a rebuild reads the same text
PACKAGES = ("fortunes-min", "fortunes")
FORTUNE_DIR = Path("usr/share/games/fortunes")
COPYRIGHT_FILE = Path("usr/share/doc/fortunes/copyright")
# English prose only: no ASCII art, no IRC logs, no Perl, no all-caps Zippy, no ethnic jokes.
FORTUNE_FILES = (
    "fortunes",
    "computers",
    "cookie",
    "definitions",
    "drugs",
    "education",
    "food",
    "goedel",
    "humorists",
    "kids",
    "law",
    "literature",
    "love",
    "magic",
    "medicine",
    "men-women",
    "miscellaneous",
    "news",
    "people",
    "pets",
    "platitudes",
    "politics",
    "pratchett",
    "riddles",
    "science",
    "songs-poems",
    "sports",
    "startrek",
    "wisdom",
    "work",
)
SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>")  # ids 0, 1, 2 (LlamaConfig's defaults)
OVERSTRIKE = re.compile(r".\x08")  # nroff-style bold/underline: "X<backspace>X"


@dataclasses.dataclass(frozen=True, slots=True)
class Corpus:
    """The cleaned fortunes, each one document, and where they came from."""

    fortunes: tuple[str, ...]
    per_file: dict[str, int]  # fortune file name -> number of fortunes taken from it
    sha256: str  # of the cleaned text, "\n\x00\n"-joined: identifies the exact training text
    copyright: str  # the package's /usr/share/doc/fortunes/copyright

    def __post_init__(self):
        if len(self.fortunes) < 1000:
            raise ValueError(
                f"only {len(self.fortunes)} fortunes were read; the fortune files of {PACKAGES} "
                "look truncated -- delete the cache dir (--cache-dir) and run again"
            )


def fetch_packages(cache_dir: Path, version: str) -> Path:
    """Download and unpack the fortune .debs under cache_dir; returns the unpacked root."""
    root = cache_dir / f"fortunes-{version.replace(':', '_')}"
    if (root / COPYRIGHT_FILE).exists():
        return root
    debs = cache_dir / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    for package in PACKAGES:
        run_checked(["apt-get", "download", f"{package}={version}"], cwd=debs)
    for deb in sorted(debs.glob("*.deb")):
        run_checked(["dpkg-deb", "-x", str(deb), str(root)], cwd=debs)
    return root


def run_checked(command: list[str], cwd: Path) -> None:
    """Run a packaging command; a failure says what to do about it."""
    if shutil.which(command[0]) is None:
        sys.exit(
            f"error: `{command[0]}` is not on PATH; this script needs a Debian-like system "
            "(apt-get, dpkg-deb) to fetch the fortune packages"
        )
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(
            f"error: `{' '.join(command)}` failed:\n{done.stderr.strip()}\n"
            "hint: run `apt-get update` first, or pass --debian-version with a version "
            "that `apt-cache policy fortunes` lists"
        )


def clean_fortune(text: str) -> str:
    """Drop overstrikes and collapse runs of blanks/tabs so the text tokenizes cleanly."""
    text = OVERSTRIKE.sub("", text)
    lines = (re.sub(r"[ \t]+", " ", line).rstrip() for line in text.splitlines())
    return "\n".join(lines).strip()


def read_fortune_file(path: Path) -> list[str]:
    """Split a fortune(6) data file on its `%` separator lines."""
    raw = path.read_text(encoding="utf-8", errors="strict")
    pieces = re.split(r"^%$", raw, flags=re.MULTILINE)
    return [c for c in (clean_fortune(p) for p in pieces) if c]


def load_corpus(root: Path) -> Corpus:
    """Read every allow-listed fortune file under an unpacked package root."""
    fortunes, per_file = [], {}
    for name in FORTUNE_FILES:
        taken = read_fortune_file(root / FORTUNE_DIR / name)
        per_file[name] = len(taken)
        fortunes.extend(taken)
    digest = hashlib.sha256("\n\x00\n".join(fortunes).encode()).hexdigest()
    copyright_text = (root / COPYRIGHT_FILE).read_text(encoding="utf-8")
    return Corpus(tuple(fortunes), per_file, digest, copyright_text)


# --- tokenizer ---------------------------------------------------------------------------


def train_tokenizer(texts: tuple[str, ...], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2 style, no prefix space) that prepends <|bos|> to every input."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    bos = SPECIAL_TOKENS[1]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A",
        pair=f"{bos} $A {bos} $B",
        special_tokens=[(bos, 1)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=SPECIAL_TOKENS[0],
        bos_token=bos,
        eos_token=SPECIAL_TOKENS[2],
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )


def check_round_trip(tokenizer: PreTrainedTokenizerFast, texts: tuple[str, ...]) -> None:
    """Byte-level BPE must reproduce its input exactly; fail loudly if it does not."""
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        back = tokenizer.decode(ids, skip_special_tokens=True)
        if back != text or ids[0] != tokenizer.bos_token_id:
            raise AssertionError(f"tokenizer round trip broke on {text!r}: got {back!r}")


def encode_stream(tokenizer: PreTrainedTokenizerFast, texts: tuple[str, ...]) -> torch.Tensor:
    """All documents as one token stream, each `<|bos|> text <|eos|>`; shape (total_tokens,)."""
    eos = tokenizer.eos_token_id
    # The backend tokenizer has no model_max_length: whole documents may exceed the context.
    encoded = tokenizer.backend_tokenizer.encode_batch(list(texts))
    return torch.tensor([t for enc in encoded for t in (*enc.ids, eos)], dtype=torch.long)


# --- model and training ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class TrainSettings:
    """How long and how hard to train; the defaults take ~12 minutes on one idle CPU core."""

    steps: int = 1200
    minutes: float = 60.0  # wall-time cap; hitting it ends training early (and breaks determinism)
    batch_size: int = 8
    seq_len: int = 128
    lr: float = 4e-3
    warmup: int = 60
    seed: int = 0
    threads: int = 1

    def __post_init__(self):
        for name in ("steps", "batch_size", "seq_len", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.minutes:
            raise ValueError(f"--minutes must be > 0, got {self.minutes}")
        if not 0 <= self.warmup < self.steps:
            raise ValueError(f"--warmup must be in [0, --steps), got {self.warmup} with {self.steps} steps")
        if not 0 < self.lr < 1:
            raise ValueError(f"--lr must be in (0, 1), got {self.lr}")


@dataclasses.dataclass(frozen=True, slots=True)
class TrainReport:
    """What training did: the loss curve and how long it took."""

    losses: tuple[float, ...]  # training loss per step
    val_loss: float  # mean loss on held-out fortunes after training
    seconds: float

    def __post_init__(self):
        if not self.losses or not all(math.isfinite(x) for x in self.losses):
            raise ValueError(
                f"training produced no or non-finite losses ({self.losses[-5:]}); lower --lr or raise --warmup"
            )


def demo_config(vocab_size: int) -> LlamaConfig:
    """A ~3M-parameter Llama: head_dim 64 (what every attention kernel supports), GQA 4:2."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=640,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        architectures=["LlamaForCausalLM"],
    )


def lr_at(step: int, settings: TrainSettings) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return settings.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def random_windows(stream: torch.Tensor, settings: TrainSettings, gen: torch.Generator) -> torch.Tensor:
    """A batch of random contiguous windows; shape (batch_size, seq_len + 1)."""
    starts = torch.randint(0, len(stream) - settings.seq_len - 1, (settings.batch_size,), generator=gen)
    return torch.stack([stream[s : s + settings.seq_len + 1] for s in starts.tolist()])


def train(model: LlamaForCausalLM, stream: torch.Tensor, settings: TrainSettings) -> tuple[list[float], bool]:
    """AdamW on random windows of the stream; returns per-step losses and whether time ran out."""
    gen = torch.Generator().manual_seed(settings.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.1)
    started = time.monotonic()
    deadline = started + settings.minutes * 60
    losses = []
    model.train()
    for step in range(settings.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, settings)
        losses.append(train_step(model, optimizer, random_windows(stream, settings, gen)))
        log_progress(step, losses, settings, started)
        if time.monotonic() > deadline:
            return losses, step + 1 < settings.steps
    return losses, False


def train_step(model: LlamaForCausalLM, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> float:
    """One next-token-prediction update; batch is (batch_size, seq_len + 1)."""
    logits = model(input_ids=batch[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def log_progress(step: int, losses: list[float], settings: TrainSettings, started: float) -> None:
    """Print the mean loss of the last 50 steps every 50 steps."""
    if (step + 1) % 50 == 0 or step + 1 == settings.steps:
        recent = losses[-50:]
        print(
            f"step {step + 1:5d}/{settings.steps}  loss {sum(recent) / len(recent):.3f}  "
            f"lr {lr_at(step, settings):.2e}  {time.monotonic() - started:6.0f} s",
            flush=True,
        )


@torch.no_grad()
def held_out_loss(model: LlamaForCausalLM, stream: torch.Tensor, seq_len: int) -> float:
    """Mean next-token loss over the held-out stream, in non-overlapping windows."""
    model.eval()
    usable = (len(stream) - 1) // seq_len * seq_len
    inputs = stream[:usable].view(-1, seq_len)
    targets = stream[1 : usable + 1].view(-1, seq_len)
    logits = model(input_ids=inputs).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).item()


def split_held_out(fortunes: tuple[str, ...], seed: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Every 50th fortune (after a seeded shuffle) is held out for the validation loss."""
    order = torch.randperm(len(fortunes), generator=torch.Generator().manual_seed(seed)).tolist()
    shuffled = [fortunes[i] for i in order]
    return tuple(shuffled[i] for i in range(len(shuffled)) if i % 50), tuple(shuffled[::50])


# --- samples, word list, README ----------------------------------------------------------

PROMPTS = ("The meaning of life is", "A computer", "Love is", "You will")


@torch.no_grad()
def sample_generations(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, seed: int
) -> list[tuple[str, str, str]]:
    """(prompt, greedy continuation, sampled continuation) for each demo prompt."""
    model.eval()
    rows = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        greedy = model.generate(ids, max_new_tokens=24, do_sample=False)
        torch.manual_seed(seed)
        sampled = model.generate(ids, max_new_tokens=24, do_sample=True, temperature=0.8, top_k=40)
        start = ids.shape[1]
        greedy_text, sampled_text = (
            tokenizer.decode(out[0, start:], skip_special_tokens=True) for out in (greedy, sampled)
        )
        rows.append((prompt, greedy_text, sampled_text))
    return rows


def corpus_words(fortunes: tuple[str, ...], limit: int) -> list[str]:
    """The `limit` most frequent lower-case alphabetic words (3+ letters) of the corpus, sorted."""
    counts = collections.Counter(w.lower() for f in fortunes for w in re.findall(r"[A-Za-z]{3,}", f))
    return sorted(word for word, _ in counts.most_common(limit))


def count_parameters(model: LlamaForCausalLM) -> int:
    """Unique parameters (the tied lm_head shares the embedding)."""
    return sum(p.numel() for p in model.parameters())


README_TEMPLATE = """\
# kernelbay demo checkpoint

A tiny Llama (`LlamaForCausalLM`, {params:,} parameters: hidden 256, 4 layers, 4 query heads /
2 KV heads of size 64, tied embeddings, context 512, weights stored in {dtype}) with a byte-level
BPE tokenizer ({vocab} tokens, `<|bos|>` prepended to every input, `<|eos|>` ends a document),
both trained from scratch on CPU by `examples/make_demo_checkpoint.py`. It exists so that
`kernelbay run` has a real model to run out of the box; it knows fortune cookies, not facts.

Files: `config.json`, `generation_config.json`, `model.safetensors` (no `lm_head.weight`: it is
tied to `model.embed_tokens.weight`), `tokenizer.json`, `tokenizer_config.json`,
`LICENSE.fortunes`, this README. `eagle3/` holds an EAGLE-3 draft trained for this model by
`examples/train_eagle3_demo.py` (`LLM(speculative=...)`; see its own README).

## Corpus and licence

{fortune_count:,} fortunes ({token_count:,} tokens) from Debian's `fortunes-min` and `fortunes`
packages, version `{version}` (Debian 12, section `main`), files: {files}.
Cleaned text sha256 `{sha256}`. The packages' copyright file, reproduced in `LICENSE.fortunes`,
puts them under the BSD licence of the Regents of the University of California (the
advertising clause deleted). The weights and tokenizer are derived from that text and are
distributed under the same terms.

## Training

{steps} steps of AdamW (batch {batch} x {seq_len} tokens, peak lr {lr}, cosine decay, seed
{seed}, {threads} CPU thread(s)) in {minutes:.1f} minutes of wall time. Training loss: {loss_first:.2f} at the
start, {loss_last:.2f} at the end (mean of the last 50 steps); held-out loss {val_loss:.2f}.

## Samples (transformers `generate` on the stored weights in float32, 24 new tokens)

{samples}

## Rebuild

    apt-get update   # if `apt-get download fortunes` cannot find the package
    python examples/make_demo_checkpoint.py --out plugins/engine/kernelbay_engine/demo

Same seed, steps and thread count give the same weights (see `--help`).
"""


def render_samples(rows: list[tuple[str, str, str]]) -> str:
    """The samples as a Markdown list: greedy and sampled (temperature 0.8, top-k 40)."""
    lines = []
    for prompt, greedy, sampled in rows:
        lines.append(f"- greedy:  {json.dumps(prompt + greedy)}")
        lines.append(f"- sampled: {json.dumps(prompt + sampled)}")
    return "\n".join(lines)


# --- main --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder to write the checkpoint into")
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "kernelbay-demo-cache")
    parser.add_argument("--debian-version", default=DEBIAN_VERSION, help="version of fortunes/fortunes-min")
    parser.add_argument(
        "--words-out",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "plugins/engine/tests/demo/corpus_words.txt",
        help="where to write the corpus word list the demo test checks against",
    )
    parser.add_argument("--vocab-size", type=int, default=3072)
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="bfloat16",
        help="dtype the weights are stored in (training is always float32)",
    )
    defaults = TrainSettings()
    for field in dataclasses.fields(TrainSettings):
        parser.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=type(getattr(defaults, field.name)),
            default=getattr(defaults, field.name),
        )
    return parser.parse_args(argv)


def train_settings(args: argparse.Namespace) -> TrainSettings:
    return TrainSettings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainSettings)})


def build(args: argparse.Namespace) -> None:
    """Fetch, tokenize, train, save, then sample from the saved folder as a user would."""
    settings = train_settings(args)
    torch.set_num_threads(settings.threads)
    corpus = load_corpus(fetch_packages(args.cache_dir, args.debian_version))
    print(f"corpus: {len(corpus.fortunes)} fortunes, sha256 {corpus.sha256[:16]}...", flush=True)
    train_texts, val_texts = split_held_out(corpus.fortunes, settings.seed)
    tokenizer = train_tokenizer(train_texts, args.vocab_size)
    stream, val_stream = encode_stream(tokenizer, train_texts), encode_stream(tokenizer, val_texts)
    print(f"tokens: {len(stream):,} train, {len(val_stream):,} held out", flush=True)
    model, losses, seconds = train_model(stream, len(tokenizer), settings)
    write_checkpoint(args.out, model, tokenizer, args.dtype)
    model, tokenizer = reload(args.out)
    check_round_trip(tokenizer, (*corpus.fortunes[:200], "Hello, world!  Tabs\tand \u00fcn\u00efc\u00f6d\u00e9 \u2713"))
    report = TrainReport(tuple(losses), held_out_loss(model, val_stream, settings.seq_len), seconds)
    rows = sample_generations(model, tokenizer, settings.seed)
    print_samples(rows)
    write_readme(args, corpus, report, rows, token_count=len(stream) + len(val_stream), params=count_parameters(model))
    write_word_list(args.words_out, corpus)
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"wrote {args.out} ({size / 1e6:.1f} MB) and {args.words_out}")


def train_model(
    stream: torch.Tensor, vocab_size: int, settings: TrainSettings
) -> tuple[LlamaForCausalLM, list[float], float]:
    """A freshly seeded demo Llama trained on the stream; returns it, its losses and seconds taken."""
    torch.manual_seed(settings.seed)
    model = LlamaForCausalLM(demo_config(vocab_size))
    print(f"model: {count_parameters(model):,} parameters", flush=True)
    start = time.monotonic()
    losses, stopped_early = train(model, stream, settings)
    if stopped_early:
        print(
            f"warning: --minutes {settings.minutes} ended training after {len(losses)} of "
            f"{settings.steps} steps; the weights are not reproducible",
            flush=True,
        )
    return model, losses, time.monotonic() - start


def write_checkpoint(out: Path, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, dtype: str) -> None:
    """config.json, generation_config.json, model.safetensors and the tokenizer files."""
    out.mkdir(parents=True, exist_ok=True)
    model.to(getattr(torch, dtype)).save_pretrained(out)
    tokenizer.save_pretrained(out)


def reload(out: Path) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """The saved folder loaded back through the Auto classes, computing in float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32), AutoTokenizer.from_pretrained(out)


def print_samples(rows: list[tuple[str, str, str]]) -> None:
    for prompt, greedy, sampled in rows:
        print(f"{prompt!r}\n  greedy:  {greedy!r}\n  sampled: {sampled!r}")


def write_readme(
    args: argparse.Namespace,
    corpus: Corpus,
    report: TrainReport,
    rows: list[tuple[str, str, str]],
    token_count: int,
    params: int,
) -> None:
    """README.md (what, corpus, licence, loss, samples, how to rebuild) and LICENSE.fortunes."""
    settings = train_settings(args)
    (args.out / "LICENSE.fortunes").write_text(corpus.copyright, encoding="utf-8")
    recent = report.losses[-50:]
    readme = README_TEMPLATE.format(
        params=params,
        dtype=args.dtype,
        vocab=args.vocab_size,
        fortune_count=len(corpus.fortunes),
        token_count=token_count,
        version=args.debian_version,
        files=", ".join(f"`{n}`" for n in FORTUNE_FILES),
        sha256=corpus.sha256,
        steps=len(report.losses),
        batch=settings.batch_size,
        seq_len=settings.seq_len,
        lr=settings.lr,
        seed=settings.seed,
        threads=settings.threads,
        minutes=report.seconds / 60,
        loss_first=report.losses[0],
        loss_last=sum(recent) / len(recent),
        val_loss=report.val_loss,
        samples=render_samples(rows),
    )
    (args.out / "README.md").write_text(readme, encoding="utf-8")


def write_word_list(path: Path, corpus: Corpus) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(corpus_words(corpus.fortunes, 5000)) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    build(parse_args(argv))


if __name__ == "__main__":
    main()
