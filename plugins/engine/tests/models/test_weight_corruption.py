"""Corrupt, inconsistent or ambiguous weight files: each is a CheckpointError naming the file or tensor, never a
traceback from deep inside the reader and never a silently wrong load."""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from kernelbay_engine import AutoModelForCausalLM
from kernelbay_engine.loading import CheckpointError, open_checkpoint

from ._files import tensors, write_sharded, write_variant

SAFE = "model.safetensors"
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def llama(tiny_checkpoints) -> Path:
    return tiny_checkpoints.get("llama3")[0]


@pytest.fixture(scope="module")
def good_bytes(llama) -> bytes:
    return (llama / SAFE).read_bytes()


def _split(data: bytes) -> tuple[dict, bytes]:
    (size,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + size]), data[8 + size :]


def _join(header, body: bytes, *, pad: int = 0, size_delta: int = 0) -> bytes:
    raw = (header if isinstance(header, bytes) else json.dumps(header).encode()) + b" " * pad
    return struct.pack("<Q", len(raw) + size_delta) + raw + body


def _folder(tmp_path: Path, llama: Path, data: bytes) -> Path:
    """A folder with the tiny Llama's config and `data` as its model.safetensors."""
    folder = write_variant(llama, tmp_path / "ckpt", {})
    (folder / SAFE).write_bytes(data)
    return folder


def _edit(good: bytes, change) -> bytes:
    header, body = _split(good)
    change(header)
    return _join(header, body)


def _set(name: str, key: str, value):
    return lambda h: h[name].__setitem__(key, value)


def _overlap(h: dict) -> None:
    h["model.layers.1.input_layernorm.weight"]["data_offsets"] = h["model.layers.0.input_layernorm.weight"][
        "data_offsets"
    ]


HEADER_CASES = {
    "length one byte short (padded header)": lambda g: _join(_split(g)[0], _split(g)[1], pad=8, size_delta=-1),
    "length one byte long": lambda g: struct.pack("<Q", struct.unpack("<Q", g[:8])[0] + 1) + g[8:],
    "length past the file": lambda g: struct.pack("<Q", 2**40) + g[8:],
    "empty file": lambda g: b"",
    "header is a JSON list": lambda g: _join(b"[1, 2]", _split(g)[1]),
    "flipped header byte": lambda g: g[:20] + bytes([g[20] ^ 0xFF]) + g[21:],
    "overlapping data_offsets": lambda g: _edit(g, _overlap),
    "unknown dtype": lambda g: _edit(g, _set("model.norm.weight", "dtype", "F17")),
    "dtype disagrees with byte range": lambda g: _edit(g, _set("model.norm.weight", "dtype", "F16")),
    "shape disagrees with byte range": lambda g: _edit(g, _set("model.norm.weight", "shape", [32])),
    "offsets reversed": lambda g: _edit(g, _set("model.norm.weight", "data_offsets", [256, 0])),
    "offsets are strings": lambda g: _edit(g, _set("model.norm.weight", "data_offsets", ["a", "b"])),
}


@pytest.mark.parametrize("case", HEADER_CASES)
def test_corrupt_header_is_refused(case, llama, good_bytes, tmp_path):
    """Each header corruption (as strict as the safetensors library) is a CheckpointError naming the file."""
    folder = _folder(tmp_path, llama, HEADER_CASES[case](good_bytes))
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        open_checkpoint(folder)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fraction=st.floats(min_value=0.0, max_value=0.9999))
def test_truncation_at_any_offset_is_refused(fraction, llama, good_bytes, tmp_path):
    """A file cut short anywhere (header or data) is refused before a byte is loaded."""
    cut = int(len(good_bytes) * fraction)
    folder = _folder(tmp_path, llama, good_bytes[:cut])
    with pytest.raises(CheckpointError, match="not a valid safetensors file"):
        open_checkpoint(folder)


def test_one_byte_short_header_used_to_load_shifted_weights(llama, good_bytes, tmp_path):
    """The silent case: a padded header whose length is one short is refused, not read one byte off."""
    header, body = _split(good_bytes)
    folder = _folder(tmp_path, llama, _join(header, body, pad=8, size_delta=-1))
    with pytest.raises(CheckpointError, match="not fully covered"):
        AutoModelForCausalLM.from_pretrained(folder, progress=False)


@pytest.mark.parametrize("kind", ["dangling", "looping", "directory"])
def test_weight_path_that_is_not_a_file(kind, llama, tmp_path):
    """A dangling or looping symlink, or a folder, named model.safetensors is named as what it is."""
    folder = write_variant(llama, tmp_path / kind, {})
    (folder / SAFE).unlink()
    if kind == "directory":
        (folder / SAFE).mkdir()
    else:
        os.symlink(folder / (SAFE if kind == "looping" else "gone.safetensors"), folder / SAFE)
    expected = "a directory" if kind == "directory" else "does not resolve"
    with pytest.raises(CheckpointError, match=expected):
        open_checkpoint(folder)


def test_tensor_in_two_files_names_both(llama, tmp_path):
    """Without an index, a tensor present in two files is refused (it used to come silently from the last)."""
    folder = write_variant(llama, tmp_path / "dup", tensors(llama))
    save_file({"model.norm.weight": torch.full((64,), 7.0)}, folder / "zz-extra.safetensors")
    with pytest.raises(CheckpointError, match=r"'model\.norm\.weight' is in both model\.safetensors and zz-extra"):
        open_checkpoint(folder)


def _shards(llama: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    folder = write_sharded(llama, tmp_path / "sharded", num_shards=2)
    return folder, json.loads((folder / INDEX).read_text())["weight_map"]


def _write_map(folder: Path, weight_map) -> None:
    (folder / INDEX).write_text(json.dumps({"weight_map": weight_map}))


def test_index_decides_which_shard_a_tensor_comes_from(llama, tmp_path):
    """A tensor the index maps to shard 2 but that lives in shard 1 is an error, not a silent read from 1."""
    folder, weight_map = _shards(llama, tmp_path)
    name = next(n for n, f in weight_map.items() if f.startswith("model-00001"))
    weight_map[name] = "model-00002-of-00002.safetensors"
    _write_map(folder, weight_map)
    with pytest.raises(CheckpointError, match=rf"'{name}' is in model-00001.* maps it to model-00002"):
        open_checkpoint(folder)


def test_shadow_copy_in_another_shard_is_refused(llama, tmp_path):
    """A second copy of a tensor in a shard the index does not map it to is refused, naming both files."""
    folder, weight_map = _shards(llama, tmp_path)
    name = next(n for n, f in weight_map.items() if f.startswith("model-00001"))
    other = folder / "model-00002-of-00002.safetensors"
    save_file({**load_file(other), name: torch.zeros(1)}, other)
    with pytest.raises(CheckpointError, match=rf"'{name}' is in model-00002.* maps it to model-00001"):
        open_checkpoint(folder)


def test_tensor_missing_from_the_index_is_refused(llama, tmp_path):
    """A shard tensor the index does not list is an error (the index and shards are out of step)."""
    folder, weight_map = _shards(llama, tmp_path)
    name = sorted(weight_map)[0]
    del weight_map[name]
    _write_map(folder, weight_map)
    with pytest.raises(CheckpointError, match=rf"'{name}' is in .* does not list it"):
        open_checkpoint(folder)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('{"weight_map": [1]}', "no 'weight_map'"),
        ('{"weight_map": {"a": 1}}', r"weight_map\['a'\] is 1"),
        ('{"weight_map": {"a": "../x.safetensors"}}', "must be the file name of a shard"),
        ("\xff\xfe", "not valid JSON"),
    ],
)
def test_malformed_index_is_refused(text, fragment, llama, tmp_path):
    """An index whose weight_map is not {tensor: shard file} is a CheckpointError, not a TypeError."""
    folder, _ = _shards(llama, tmp_path)
    (folder / INDEX).write_bytes(text.encode("latin-1"))
    with pytest.raises(CheckpointError, match=fragment):
        open_checkpoint(folder)


def test_nan_weight_names_the_tensor(llama, tmp_path):
    """A NaN in a directly loaded tensor is refused, naming it."""
    state = tensors(llama)
    state["model.embed_tokens.weight"][5, 3] = float("nan")
    folder = write_variant(llama, tmp_path / "nan", state)
    with pytest.raises(CheckpointError, match=r"model\.embed_tokens\.weight .* NaN or infinite"):
        AutoModelForCausalLM.from_pretrained(folder, progress=False)


def test_inf_in_a_fused_tensor_names_it_in_mmap_mode(llama, tmp_path):
    """An inf in a tensor fused into q/k/v is named too, and mmap mode checks as well."""
    state = tensors(llama)
    state["model.layers.0.self_attn.k_proj.weight"][0, 0] = float("inf")
    folder = write_variant(llama, tmp_path / "inf", state)
    for mmap in (False, True):
        with pytest.raises(CheckpointError, match=r"model\.layers\.0\.self_attn\.k_proj\.weight .* NaN or infinite"):
            AutoModelForCausalLM.from_pretrained(folder, progress=False, mmap=mmap)


def test_cast_overflow_to_inf_is_refused(llama, tmp_path):
    """A float32 value too large for float16 would load as inf: refused, saying so."""
    state = tensors(llama)
    state["model.norm.weight"][0] = 1e6
    folder = write_variant(llama, tmp_path / "big", state)
    with pytest.raises(CheckpointError, match=r"model\.norm\.weight .*torch\.float16.*overflow"):
        AutoModelForCausalLM.from_pretrained(folder, dtype="float16", progress=False)


def test_vocab_size_larger_than_embedding_names_both_tensors(llama, tmp_path):
    """config.json's vocab_size above the embedding's rows names each mismatched tensor before any read."""
    folder = write_variant(llama, tmp_path / "vocab", tensors(llama), vocab_size=400)
    with pytest.raises(CheckpointError) as err:
        AutoModelForCausalLM.from_pretrained(folder, progress=False)
    rows = tensors(llama)["model.embed_tokens.weight"].shape[0]
    lines = str(err.value).splitlines()
    assert f"model.embed_tokens.weight: checkpoint shape [{rows}, 64] != model shape [400, 64]" in lines
    assert f"lm_head.weight: checkpoint shape [{rows}, 64] != model shape [400, 64]" in lines
    assert "vocab_size" in lines[-1]


def _tokenizer_folder(llama: Path, tmp_path: Path) -> Path:
    import shutil

    return shutil.copytree(llama, tmp_path / "tok")


def test_corrupt_tokenizer_files_are_a_tokenizer_error(tiny_llama, tmp_path):
    """A tokenizer.json or tokenizer_config.json that does not load is a TokenizerError naming the folder."""
    from kernelbay_engine.tokenizer import Tokenizer, TokenizerError

    folder = _tokenizer_folder(tiny_llama, tmp_path)
    for name, text in [("tokenizer.json", '{"version": "1.0", "model": 5}'), ("tokenizer_config.json", "{nope")]:
        good = (folder / name).read_text()
        (folder / name).write_text(text)
        with pytest.raises(TokenizerError, match=rf"tokenizer in '{folder}' cannot be loaded"):
            Tokenizer(folder)
        (folder / name).write_text(good)


@pytest.mark.parametrize(
    "template, cause",
    [("{{ raise_exception('no user role') }}", "no user role"), ("{% for m in messages %}{{ m", "TemplateSyntaxError")],
)
def test_chat_template_that_fails_is_a_tokenizer_error(template, cause, tiny_llama, tmp_path):
    """A chat template that raises or does not parse is a TokenizerError saying how to get past it."""
    from kernelbay_engine.tokenizer import Tokenizer, TokenizerError

    folder = _tokenizer_folder(tiny_llama, tmp_path)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerError, match=rf"chat template .*{cause}.*--raw"):
        Tokenizer(folder).encode_chat([{"role": "user", "content": "hi"}])


# ---- dtypes, tied heads, generation_config.json (issue 28) ---------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool], ids=str)
def test_float_weight_stored_as_integers_is_refused(dtype, llama, tmp_path):
    """A float weight stored as int32/int64/int8/uint8/bool used to be cast silently: refused, all named at once."""
    state = tensors(llama)
    for name in ("model.norm.weight", "model.layers.0.self_attn.k_proj.weight"):  # a plain and a fused tensor
        state[name] = state[name].to(dtype)
    folder = write_variant(llama, tmp_path / "ints", state)
    with pytest.raises(CheckpointError) as err:
        AutoModelForCausalLM.from_pretrained(folder, progress=False)
    stored = str(dtype).removeprefix("torch.")
    for name in ("model.norm.weight", "model.layers.0.self_attn.k_proj.weight"):
        assert f"{name} is stored as {stored} where the model holds float32" in str(err.value)
    assert "quantization_config" in str(err.value) and "\n" not in str(err.value)  # one line


STORED_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.int64,
                 torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]  # fmt: skip


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_tensor_in_any_stored_dtype_is_a_cast_or_refused_by_name(data, llama, tmp_path_factory):
    """Fuzz: one tensor re-stored in any safetensors dtype. A float one loads (a cast; NaN/inf still refused), an
    integer or bool one is refused naming it; nothing loads silently as other numbers."""
    state = tensors(llama)
    name = data.draw(st.sampled_from(sorted(state)), label="tensor")
    dtype = data.draw(st.sampled_from(STORED_DTYPES), label="dtype")
    state[name] = state[name].clamp(-100, 100).to(dtype)
    folder = write_variant(llama, tmp_path_factory.mktemp("dtype"), state)
    if dtype.is_floating_point:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32", progress=False)
        assert dict(model.named_parameters())  # loaded
        return
    with pytest.raises(CheckpointError, match=rf"{re.escape(name)} is stored as {str(dtype)[6:]} where"):
        AutoModelForCausalLM.from_pretrained(folder, dtype="float32", progress=False)


def test_float_weights_of_another_float_dtype_still_load(llama, tmp_path):
    """bfloat16 weights into a float32 model are a cast, as before (only integers and bool are refused)."""
    state = {name: t.to(torch.bfloat16) for name, t in tensors(llama).items()}
    folder = write_variant(llama, tmp_path / "bf16", state)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32", progress=False)
    assert model.model.norm.weight.dtype == torch.float32


def _tied_folder(tiny_llama: Path, tmp_path: Path, head: str) -> Path:
    """The tiny Llama (with its tokenizer) saying tie_word_embeddings: true, storing a head that is its own
    (`head="own"`) or a copy of the embedding table (`"copy"`)."""
    import shutil

    folder = shutil.copytree(tiny_llama, tmp_path / f"tied-{head}")
    state = tensors(folder)
    if head == "copy":
        state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    return write_variant(tiny_llama, folder, state, tie_word_embeddings=True)


def _greedy_tokens_both_ways(folder: Path) -> tuple[list[int], list[int], object]:
    from transformers import AutoModelForCausalLM as HFAutoModel

    from kernelbay_engine import LLM, SamplingParams

    prompt = [1, 5, 9, 14, 22]
    hf = HFAutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    reference = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0].tolist()[len(prompt) :]
    llm = LLM(folder, progress=False)
    ours = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0].token_ids
    return reference, list(ours), llm


def test_tied_config_with_a_different_stored_head_runs_as_transformers_does(tiny_llama, tmp_path, caplog):
    """tie_word_embeddings: true, but the checkpoint stores its own lm_head.weight: transformers 5.x keeps the stored
    head untied; kernelbay does too (the same greedy tokens), and says so (a warning, and a note on the config)."""
    reference, ours, llm = _greedy_tokens_both_ways(_tied_folder(tiny_llama, tmp_path, "own"))
    assert ours == reference
    model = llm.model
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert not llm.config.tie_word_embeddings and any("the stored head is used" in n for n in llm.config.notes)
    assert any("lm_head.weight that differs" in r.getMessage() for r in caplog.records)


def test_tied_config_storing_a_copy_of_the_embedding_stays_tied(tiny_llama, tmp_path):
    """A stored head equal to the embedding table changes nothing: tied (held once), the same tokens."""
    reference, ours, llm = _greedy_tokens_both_ways(_tied_folder(tiny_llama, tmp_path, "copy"))
    assert ours == reference
    assert llm.model.lm_head.weight is llm.model.model.embed_tokens.weight and llm.config.tie_word_embeddings


def test_explain_and_load_refuse_an_unloadable_quantization_alike(llama, tmp_path):
    """quant_method "zzz": explain used to say runnable while run refused; one check, the same message."""
    from kernelbay.errors import ConfigError
    from kernelbay_engine.explain import explain_model

    folder = write_variant(llama, tmp_path / "zzz", tensors(llama), quantization_config={"quant_method": "zzz"})
    with pytest.raises(ConfigError) as explained:
        explain_model(folder)
    with pytest.raises(ConfigError) as loaded:
        AutoModelForCausalLM.from_pretrained(folder, progress=False)
    assert str(explained.value) == str(loaded.value) and "'zzz'" in str(loaded.value)
