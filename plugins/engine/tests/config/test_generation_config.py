"""generation_config.json: its end-of-sequence tokens stop generation (as in transformers); a malformed file or
field is a warning naming the file and the field, never silently ignored."""

from __future__ import annotations

import json
import shutil

import pytest

from kernelbay_engine.config._generation import GenerationConfigWarning, generation_eos_token_ids

VOCAB = 320


@pytest.mark.parametrize(
    "text, eos",
    [('{"eos_token_id": 2}', {2}), ('{"eos_token_id": [2, 7]}', {2, 7}), ('{"bos_token_id": 1}', set()), ("{}", set())],
)
def test_eos_token_ids_are_read(tmp_path, text, eos):
    (tmp_path / "generation_config.json").write_text(text)
    assert generation_eos_token_ids(tmp_path, VOCAB) == eos


def test_no_file_and_a_weight_file_have_none(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    assert generation_eos_token_ids(tmp_path, VOCAB) == set()
    assert generation_eos_token_ids(tmp_path / "x.gguf", VOCAB) == set()


@pytest.mark.parametrize(
    "text, named",
    [
        ('{"eos_token_id": 2,}', r"generation_config\.json is not valid JSON: .* line 1, column 20"),
        ('{"eos_token_id": NaN}', r"generation_config\.json: eos_token_id is nan"),
        ("[1, 2]", r"generation_config\.json holds a JSON list, not an object"),
        ('{"eos_token_id": "2"}', r"generation_config\.json: eos_token_id '2' is not a token id"),
        ('{"eos_token_id": [2, 320]}', r"generation_config\.json: eos_token_id \[2, 320\] .*0 to 319"),
        ('{"eos_token_id": [2, true]}', r"generation_config\.json: eos_token_id \[2, True\]"),
        ('{"eos_token_id": -1}', r"generation_config\.json: eos_token_id -1"),
    ],
)
def test_malformed_file_or_field_is_a_warning_naming_them(tmp_path, text, named):
    """Each used to be ignored silently; now a GenerationConfigWarning naming the file and the field, and ignored."""
    (tmp_path / "generation_config.json").write_text(text)
    with pytest.warns(GenerationConfigWarning, match=named):
        assert generation_eos_token_ids(tmp_path, VOCAB) == set()


def _folder_with(tiny_llama, tmp_path, generation: str):
    folder = shutil.copytree(tiny_llama, tmp_path / "model")
    (folder / "generation_config.json").write_text(generation)
    return folder


def test_llm_stops_at_a_generation_config_eos_token(tiny_llama, tmp_path):
    """An eos token only generation_config.json names (Llama 3 Instruct's <|eot_id|>) ends the completion."""
    from kernelbay_engine import LLM, SamplingParams

    prompt, greedy = [1, 5, 9, 14, 22], SamplingParams(max_tokens=8, temperature=0)
    free = LLM(tiny_llama, progress=False).generate([prompt], greedy)[0].token_ids
    stop = free[3]
    folder = _folder_with(tiny_llama, tmp_path, json.dumps({"eos_token_id": [2, stop]}))
    out = LLM(folder, progress=False).generate([prompt], greedy)[0]
    assert out.token_ids == free[: free.index(stop) + 1] and out.finish_reason == "stop"


def test_llm_warns_about_a_malformed_generation_config(tiny_llama, tmp_path):
    """Through LLM (and so `kernelbay run`): the warning names the file and the field."""
    from kernelbay_engine import LLM

    folder = _folder_with(tiny_llama, tmp_path, '{"eos_token_id": "eos"}')
    with pytest.warns(GenerationConfigWarning, match=rf"{folder}/generation_config\.json: eos_token_id 'eos'"):
        LLM(folder, progress=False)
