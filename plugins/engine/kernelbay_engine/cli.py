"""`kernelbay run [MODEL] --prompt TEXT`: stream a completion to stdout (default model: the embedded demo).

Contributed to the `kernelbay` CLI host through the `kernelbay.commands` entry point `run`."""

from __future__ import annotations

import argparse
import sys

from kernelbay.cli import COMMAND_SUMMARIES, backend_options
from kernelbay.errors import InputError, KernelbayError


def add_run_command(parser):
    """The `kernelbay.commands` hook: add `run`'s arguments to its parser, return its handler."""
    parser.description = COMMAND_SUMMARIES["run"]
    add_arguments(parser)
    return run


def add_arguments(parser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--prompt", required=True, help="text to complete")
    parser.add_argument("--max-tokens", type=int, default=64, metavar="N", help="tokens to generate (default 64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 (default) keeps every token")
    parser.add_argument("--seed", type=int, help="make sampling reproducible")
    parser.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop at this text (repeatable)")
    parser.add_argument(
        "--logprobs",
        type=int,
        metavar="K",
        help="after the text, print each generated token's log-probability and the K most likely tokens (stderr)",
    )
    parser.add_argument("--raw", action="store_true", help="do not apply the folder's chat template")
    parser.add_argument(
        "--stats",
        action="store_true",
        help="print the engine's counters on stderr at the end (speculative acceptance, prefix-cache hits)",
    )


def add_engine_arguments(parser) -> None:
    """MODEL and every option that shapes the engine: shared by `run` and `serve`."""
    parser.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        help="model folder (config.json, safetensors weights, tokenizer) or .gguf file; default: the demo",
    )
    parser.add_argument("--backend", metavar="NAME", help="attention backend (default: the first capable one)")
    parser.add_argument(
        "--backend-option",
        action="append",
        default=[],
        metavar="NAME.KEY=VALUE",
        help="a typed option of one attention backend, e.g. FLEX.compile=false (repeatable)",
    )
    parser.add_argument(
        "--moe-backend", metavar="NAME", help="MoE expert kernel of MoE models (default: the first capable one)"
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="default: the checkpoint's")
    parser.add_argument(
        "--quantization",
        choices=("int8", "int8-channel", "int4", "gguf", "none"),
        help="int8 (groups of 32) / int8-channel / int4: quantize a float checkpoint's linears after loading (CPU "
        "kernels); a .gguf file runs on its "
        "own Q8_0/Q4_x codes by default (gguf), none dequantizes them to dense weights",
    )
    parser.add_argument(
        "--kv-cache-memory", metavar="SIZE", help="KV-cache size, e.g. 256MiB (default: sized for the request)"
    )
    parser.add_argument(
        "--speculative",
        metavar="ngram|DIR",
        help="speculative decoding: ngram proposes next tokens by prompt lookup, DIR an EAGLE-3 draft folder trained "
        "for this model; the model verifies them in the same step (same greedy output, same sampling distribution)",
    )
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        metavar="K",
        help="tokens proposed per step with --speculative (default 4)",
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse the cached KV blocks of shared prompt prefixes (default: on)",
    )
    parser.add_argument(
        "--model-impl",
        choices=("auto", "native", "transformers"),
        default="auto",
        help="auto (default): a native family if installed, else the transformers fallback; native: never the "
        "fallback; transformers: the fallback even where a native family exists",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="shard the model over N ranks (worker processes on torch.distributed; default 1)",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow the folder's own config/tokenizer code to run (off by default)",
    )


def sampling_params(args):
    from kernelbay_engine.sampling import SamplingParams

    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=tuple(args.stop),
        logprobs=args.logprobs,
    )


def build_llm(args, folder):
    from kernelbay_engine.llm import LLM

    return LLM(folder, max_num_seqs=1, **engine_options(args))


def engine_options(args) -> dict:
    """LLM's keyword arguments from the options `add_engine_arguments` added (all but the model and batch size)."""
    return dict(
        attention_backend=args.backend,
        moe_backend=args.moe_backend,
        dtype=args.dtype,
        quantization=args.quantization,
        model_impl=args.model_impl,
        kv_cache_memory=args.kv_cache_memory,
        enable_prefix_caching=args.enable_prefix_caching,
        speculative=args.speculative,
        num_speculative_tokens=args.num_speculative_tokens,
        trust_remote_code=args.trust_remote_code,
        attention_backend_options=backend_options(args.backend_option),
        tensor_parallel_size=args.tensor_parallel_size,
    )


def kv_cache_memory_argument(value: str | None) -> int | None:
    """--kv-cache-memory in bytes, or an InputError saying how to write it (checked before anything loads)."""
    from kernelbay_engine.memory import parse_memory

    if value is None:
        return None
    try:
        return parse_memory(value)
    except ValueError as err:
        raise InputError(f"--kv-cache-memory: {err}") from None


def prompt_ids(llm, args) -> list[int]:
    tokenizer = llm.tokenizer
    if tokenizer is not None and tokenizer.has_chat_template and not args.raw:
        return tokenizer.encode_chat([{"role": "user", "content": args.prompt}])
    return llm.encode(args.prompt)


def run(args) -> int:
    from kernelbay_engine.inputs import check_model_folder, demo_model_folder
    from kernelbay_engine.logprob_lines import logprob_lines

    params = sampling_params(args)  # bad flags and folders fail before torch is even imported
    args.kv_cache_memory = kv_cache_memory_argument(args.kv_cache_memory)
    folder = check_model_folder(args.model if args.model else demo_model_folder())
    llm = build_llm(args, folder)  # a cache the device cannot hold is an InputError naming kv_cache_memory
    ids = prompt_ids(llm, args)
    steps = []  # (token id, its logprobs entry) with --logprobs
    try:
        for delta in llm.stream([ids], params):
            sys.stdout.write(delta.text)
            sys.stdout.flush()
            if delta.logprobs is not None:
                steps.append((delta.token_id, delta.logprobs))
    except KeyboardInterrupt:  # the line ends, then the host says "interrupted" and exits 130
        sys.stdout.write("\n")
        sys.stdout.flush()
        raise
    except KernelbayError:  # e.g. a backend failing at decode: the error line starts below the partial text
        sys.stdout.write("\n")
        raise
    sys.stdout.write("\n")
    if args.logprobs is not None:
        sys.stdout.flush()  # the text first, then its logprobs
        sys.stderr.write("".join(f"{line}\n" for line in logprob_lines(llm.tokenizer, steps, args.logprobs)))
    if args.stats:
        print_stats(llm.stats())
    return 0


def print_stats(stats) -> None:
    """The engine's counters after a run, one `name: value` line each, on stderr (stdout holds the text)."""
    lines = [
        f"prefix cache hits: {stats.prefix_cache_hits} of {stats.prefix_cache_queries} prompt tokens",
        f"speculative proposals: {stats.spec_draft_tokens} tokens in {stats.spec_verifications} verifications",
        f"speculative acceptance rate: {stats.spec_acceptance_rate:.3f}",
        f"speculative mean accepted length: {stats.spec_mean_accepted_length:.2f} tokens per verification",
    ]
    sys.stderr.write("".join(f"{line}\n" for line in lines))
