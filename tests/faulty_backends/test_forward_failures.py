"""A backend that raises inside forward, or returns NaN, is a BackendFailure (exit 13) naming the backend, its
distribution, the layer and the engine step: one line, the traceback only under --trace; never garbage text."""

from __future__ import annotations

from kernelbay_engine.errors import EXIT_CODES

PREFIX = "kernelbay run: error: "


def test_backend_failure_has_its_own_documented_exit_code():
    """BackendFailure exits 13, a code no other error uses."""
    assert EXIT_CODES["BackendFailure"] == 13
    assert list(EXIT_CODES.values()).count(13) == 1


def test_a_backend_raising_in_forward_names_backend_distribution_layer_and_step(kernelbay_cli):
    """FAULTY_RAISES raises in layer 1 at the first (prefill) step: one line naming all of that, exit 13."""
    done = kernelbay_cli("run", "--prompt", "hello", "--max-tokens", "4", "--backend", "FAULTY_RAISES")
    assert done.returncode == 13, done.stderr
    assert done.stderr.startswith(PREFIX) and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    for needle in (
        "attention backend 'FAULTY_RAISES' (kb-fixture-faulty 2.1, external)",
        "failed in layer model.layers.1.",
        "at engine step 1 (prefill of 1 request)",
        "RuntimeError: vendor kernel: illegal memory access",
        "--trace",
    ):
        assert needle in done.stderr, (needle, done.stderr)


def test_a_backend_raising_at_decode_ends_the_partial_text_then_names_the_step(kernelbay_cli):
    """FAULTY_DECODE fails at the first decode step: the text so far is on stdout, the error names step 2."""
    done = kernelbay_cli("run", "--prompt", "hello", "--max-tokens", "4", "--backend", "FAULTY_DECODE")
    assert done.returncode == 13, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.startswith(PREFIX), done.stderr
    assert "failed in layer model.layers.0." in done.stderr and "at engine step 2 (decode of 1 request)" in done.stderr
    assert "NotImplementedError" not in done.stderr and "decode kernel not implemented" in done.stderr
    assert done.stdout.endswith("\n"), repr(done.stdout)  # the error line starts a line of its own


def test_trace_shows_the_backends_own_traceback(kernelbay_cli):
    """Under --trace the same error line comes after the traceback, which reaches into the plugin's module."""
    done = kernelbay_cli("run", "--trace", "--prompt", "hello", "--max-tokens", "2", "--backend", "FAULTY_RAISES")
    assert done.returncode == 13, done.stderr
    assert "Traceback" in done.stderr and "kb_faulty/backends.py" in done.stderr, done.stderr[-3000:]
    assert done.stderr.rstrip().splitlines()[-1].startswith(PREFIX)


def test_nan_logits_are_an_error_naming_the_backends_in_use(kernelbay_cli):
    """FAULTY_NAN returns NaN: exit 13 naming it and its distribution, never text decoded from garbage."""
    done = kernelbay_cli("run", "--prompt", "hello", "--max-tokens", "4", "--backend", "FAULTY_NAN")
    assert done.returncode == 13, done.stderr
    assert done.stdout.strip() == "" and "Traceback" not in done.stderr, (done.stdout, done.stderr)
    assert "the logits of engine step 1 (prefill of 1 request) are not finite" in done.stderr
    assert "attention 'FAULTY_NAN' (kb-fixture-faulty 2.1, external)" in done.stderr


def test_an_moe_backend_raising_in_forward_names_it_and_the_layer(faulty_site, tmp_path):
    """Through the API: FAULTY_MOE raising in a tiny Mixtral's experts is a BackendFailure naming the MoE backend,
    its distribution, the MoE layer's name and the step (a subprocess: the fixture site on its path)."""
    import os
    import subprocess
    import sys

    import torch
    import transformers

    config = transformers.MixtralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    transformers.MixtralForCausalLM(config).eval().save_pretrained(tmp_path)
    script = (
        "import sys\n"
        "from kernelbay_engine import LLM, SamplingParams\n"
        "from kernelbay_engine.errors import BackendFailure\n"
        "llm = LLM(sys.argv[1], moe_backend='FAULTY_MOE', progress=False, max_num_seqs=1)\n"
        "try:\n"
        "    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0))\n"
        "except BackendFailure as err:\n"
        "    print(err)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELBAY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(faulty_site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    message = done.stdout.strip()
    assert message.startswith(
        "MoE backend 'FAULTY_MOE' (kb-fixture-faulty 2.1, external) failed in layer model.layers.0."
    )
    assert "at engine step 1 (prefill of 1 request): IndexError: expert kernel: routing table out of range" in message
    assert "moe_backend= (--moe-backend NAME)" in message
