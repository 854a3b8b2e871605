"""`kernelbay explain`: a valid, schema-conforming document or a clear error for every real config."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest

from kernelbay.cli import main
from kernelbay_engine.explain.text import compact_layers
from tests._explain_schema import keys, validate

from .conftest import CONFIGS, REPO, run_cli

CONFIG_FOLDERS = sorted(p for p in CONFIGS.iterdir() if (p / "config.json").is_file())


def explain_in_process(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["explain", *args])
    return code, out.getvalue(), err.getvalue()


def test_every_shared_config_gives_a_document_or_a_clear_error():
    """All real HF configs: exit 0 with a schema-valid document, or `error:` + a non-zero code; no traceback."""
    assert len(CONFIG_FOLDERS) > 50
    documents = 0
    for folder in CONFIG_FOLDERS:
        code, out, err = explain_in_process(str(folder), "--json", "--memory", "2")
        if code == 0:
            doc = json.loads(out)
            assert validate(doc) == [], (folder.name, validate(doc))
            fit, per_token = doc["sections"]["kv_memory"]["tokens_that_fit"], doc["kv_cache"]["bytes_per_token"]
            assert fit % 16 == 0 and fit <= 2 * 2**30 // per_token, (folder.name, fit)  # whole blocks of 16
            documents += 1
        else:
            assert err.startswith("kernelbay explain: error: ") and len(err.splitlines()) >= 1, (folder.name, err)
            assert "Traceback" not in err and code not in (0, 2), (folder.name, code, err)
    assert documents >= 30, "most shared configs are Llama/Qwen/Mistral/Gemma-2/DeepSeek, which are supported"


def test_text_report_walks_config_to_kv_budget():
    """The human form names the config, slot, provider, chosen backend with reasons, and the KV budget."""
    code, out, _ = explain_in_process(str(CONFIGS / "gemma-2-2b"), "--memory", "1")
    assert code == 0
    for fragment in (
        "gemma2 / Gemma2ForCausalLM",
        "model slot 'Gemma2ForCausalLM'",
        "kernelbay_llama",
        "sliding_attention",
        "logit_softcap",
        "* VANILLA",
        "bytes/token",
        "1.0 GiB holds",
    ):
        assert fragment in out, fragment


def test_requested_backend_is_reported_or_refused():
    """--backend VANILLA is shown as requested; --backend SDPA on Gemma-2 is an incapable-backend error (8)."""
    code, out, _ = explain_in_process(str(CONFIGS / "gemma-2-2b"), "--json", "--backend", "VANILLA")
    doc = json.loads(out)
    assert code == 0 and doc["attention"]["requested_backend"] == "VANILLA"
    assert all(g["backend"] == "VANILLA" for g in doc["attention"]["layer_groups"])
    code, _, err = explain_in_process(str(CONFIGS / "gemma-2-2b"), "--backend", "SDPA")
    assert code == 8 and "logit_softcap" in err


def test_kv_dtype_changes_the_budget():
    """--kv-dtype fp8 halves the bytes per token of a bfloat16 model."""
    docs = [
        json.loads(explain_in_process(str(CONFIGS / "llama-3.1-8b"), "--json", "--kv-dtype", d)[1])
        for d in ("auto", "fp8")
    ]
    assert docs[0]["kv_cache"]["bytes_per_token"] == 2 * docs[1]["kv_cache"]["bytes_per_token"] == 131072


def test_unsupported_architecture_matches_the_api_error():
    """The CLI prints the same message AutoModelForCausalLM raises, and exits 6 (native implementations only:
    the transformers fallback would serve this architecture)."""
    from kernelbay.errors import UnknownNameError
    from kernelbay_engine import AutoModelForCausalLM
    from kernelbay_engine.config import ModelConfig

    folder = CONFIGS / "phi-3-small-8k-instruct"
    with pytest.raises(UnknownNameError) as api:
        AutoModelForCausalLM.from_config(ModelConfig.from_pretrained(folder), model_impl="native")
    code, _, err = explain_in_process(str(folder), "--model-impl", "native")
    assert code == 6 and err.strip() == f"kernelbay explain: error: {api.value}"


def test_schema_page_documents_every_key():
    """docs/explain-schema.md lists exactly the keys of the schema the validator enforces."""
    text = (REPO / "docs" / "explain-schema.md").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.M))
    assert documented == set(keys())


def test_validator_reports_departures():
    """A wrong type, a missing and an extra key are each reported with their path, also inside a section."""
    problems = validate({"schema_version": "1", "extra": 1})
    assert "$.schema_version: '1' is not of type 'integer'" in problems
    assert "$: 'kv_cache' is a required property" in problems
    assert "$: Additional properties are not allowed ('extra' was unexpected)" in problems
    doc = json.loads(explain_in_process(str(CONFIGS / "gemma-2-2b"), "--json", "--memory", "1")[1])
    doc["sections"]["kv_memory"]["tokens_that_fit"] = None
    doc["sections"]["other_plugin"] = {"text": "no lines"}
    assert validate(doc) == [
        "$.sections.kv_memory.tokens_that_fit: None is not of type 'integer'",
        "$.sections.other_plugin: 'lines' is a required property",
    ]


def test_compact_layer_lists():
    """Runs of layers print as ranges; long alternating lists are cut."""
    assert compact_layers([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8 (6)"
    assert compact_layers(list(range(0, 20, 2))) == "0, 2, 4, ..., 16, 18 (10)"


def test_explain_json_as_a_subprocess():
    """The installed entry point prints a valid document for a real config."""
    result = run_cli("explain", str(CONFIGS / "deepseek-v3"), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert validate(doc) == [] and doc["config"]["mla"]["kv_lora_rank"] == 512


def test_custom_dir_provider_is_shown(tmp_path):
    """An architecture added by --custom-module-dirs is explained with origin custom-dir (subprocess)."""
    module = tmp_path / "my_models" / "my_llama.py"
    module.parent.mkdir()
    module.write_text(
        "from kernelbay import register_model\n"
        "from kernelbay_llama.modeling import LlamaForCausalLM\n\n\n"
        "@register_model('MyLlamaForCausalLM')\n"
        "class MyLlamaForCausalLM(LlamaForCausalLM):\n"
        "    pass\n"
    )
    folder = tmp_path / "model"
    folder.mkdir()
    config = json.loads((CONFIGS / "llama-3.2-1b" / "config.json").read_text())
    config["architectures"] = ["MyLlamaForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    result = run_cli("explain", str(folder), "--json", "--custom-module-dirs", str(module))
    assert result.returncode == 0, result.stderr
    provider = json.loads(result.stdout)["provider"]
    assert provider["origin"] == "custom-dir" and provider["module"].endswith("my_llama")


def test_tokens_that_fit_counts_whole_blocks():
    """--memory holds whole 16-token blocks, as the engine holds them, not a fraction of the last one."""
    code, out, _ = explain_in_process(str(CONFIGS / "gemma-2-2b"), "--json", "--memory", "1")
    doc = json.loads(out)
    per_token, memory = doc["kv_cache"]["bytes_per_token"], doc["sections"]["kv_memory"]
    assert code == 0 and 2**30 // per_token == 10082  # partial blocks would promise 10082
    assert memory["tokens_that_fit"] == 2**30 // (16 * per_token) * 16 == 10080
    assert memory["memory_bytes"] == 2**30 and memory["bytes_per_block"] == 16 * per_token
    assert "kv_memory" not in json.loads(explain_in_process(str(CONFIGS / "gemma-2-2b"), "--json")[1])["sections"]


def test_explain_without_the_engine_names_the_distribution(monkeypatch):
    """With kernelbay-engine disabled, `kernelbay explain` is an error naming the distribution and the way back."""
    from kernelbay.registry import default_registry, reset_registry

    monkeypatch.setenv("KERNELBAY_DISABLE_PLUGINS", "kernelbay-engine")
    previous = default_registry()
    reset_registry()  # discovery reads the variable
    try:
        code, _, err = explain_in_process(str(CONFIGS / "gemma-2-2b"))
    finally:
        reset_registry(previous)
    assert code == 1 and "`kernelbay explain` comes from kernelbay-engine, which is disabled by" in err, err
    assert "remove kernelbay-engine from KERNELBAY_DISABLE_PLUGINS" in err


def test_text_output_shows_how_defaults_and_quirks_were_resolved():
    """The notes (defaults taken, fields ignored, family rules applied) are printed in text mode, not only --json."""
    done = run_cli("explain", str(CONFIGS / "gemma-2-9b"))
    assert done.returncode == 0, done.stderr
    assert "  note       layers: the 'gemma2' rule of kernelbay_llama" in done.stdout
