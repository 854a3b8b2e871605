"""Every GGUF file kernelbay cannot serve is refused with an error that names what is wrong."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernelbay_gguf.tensors import SUPPORTED_TYPES

from kernelbay.errors import MalformedConfig, MissingConfigFile, UnsupportedArchitecture
from kernelbay_engine.config import ModelConfig
from kernelbay_engine.loading import CheckpointError, open_checkpoint
from plugins.gguf.tests._tiny import TINY_GGUF
from plugins.gguf.tests._write import add_metadata, write_gguf
from tests.models.conftest import build_reference


@pytest.fixture(scope="module")
def tiny_llama():
    return build_reference("llama", tiny=TINY_GGUF["llama"][1])


def test_unsupported_architecture_is_named(tmp_path, tiny_llama):
    path = write_gguf(tmp_path / "m.gguf", tiny_llama, "llama", architecture="mamba")
    with pytest.raises(UnsupportedArchitecture, match=r"architecture 'mamba' is not supported .*llama, phi3, qwen2"):
        ModelConfig.from_pretrained(path)


def test_gemma_1_is_refused_because_transformers_cannot_read_it(tmp_path, tiny_llama):
    """Gemma 1 (general.architecture gemma): transformers has no GGUF mapping for it, so there is no reference."""
    path = write_gguf(tmp_path / "m.gguf", tiny_llama, "llama", architecture="gemma")
    with pytest.raises(UnsupportedArchitecture, match=r"'gemma' is not supported: transformers cannot load Gemma 1"):
        ModelConfig.from_pretrained(path)


@pytest.fixture(scope="module")
def tiny_phi3():
    return build_reference("phi3", tiny=TINY_GGUF["phi3"][1])


def test_partial_rotary_is_refused(tmp_path, tiny_phi3):
    """Phi-4-mini rotates 3/4 of each head: rope.dimension_count below the head size is not silently run whole."""
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(path, "phi3")
    add_metadata(writer, tiny_phi3.config, "phi3", skip=("rope_dimension_count",))
    writer.add_rope_dimension_count(12)
    _finish(writer)
    with pytest.raises(MalformedConfig, match=r"phi3\.rope\.dimension_count 12 differs from the head size 16"):
        ModelConfig.from_pretrained(path)


def test_long_rope_factors_are_refused(tmp_path, tiny_phi3):
    """Phi-3 128k files carry rope_factors_long / _short tensors (LongRoPE): refused, not run unscaled."""
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(path, "phi3")
    add_metadata(writer, tiny_phi3.config, "phi3")
    writer.add_tensor("rope_factors_long.weight", np.ones(8, dtype=np.float32))
    _finish(writer)
    with pytest.raises(MalformedConfig, match=r"per-frequency rope factors \(rope_factors_long\.weight\)"):
        ModelConfig.from_pretrained(path)


def test_rope_scaling_other_than_linear_is_refused(tmp_path, tiny_llama):
    """YaRN (Qwen2.5 128k files): refused by name, not run unscaled."""
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    add_metadata(writer, tiny_llama.config, "llama")
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(4.0)
    _finish(writer)
    with pytest.raises(MalformedConfig, match=r"uses rope scaling 'yarn', which kernelbay-gguf does not map yet"):
        ModelConfig.from_pretrained(path)


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_missing_metadata_key_is_named(tmp_path, tiny_llama):
    path = write_gguf(tmp_path / "m.gguf", tiny_llama, "llama", skip_keys=("block_count",))
    with pytest.raises(MalformedConfig, match=r"lacks the metadata key\(s\) llama\.block_count"):
        ModelConfig.from_pretrained(path)


def test_unsupported_quant_type_names_the_tensor_and_type(tmp_path, tiny_llama):
    """IQ4_NL bytes (readable by llama.cpp, not by kernelbay-gguf): refused before any weight loads."""
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    add_metadata(writer, tiny_llama.config, "llama")
    block_bytes, block_size = gguf.GGML_QUANT_SIZES[Q.IQ4_NL][1], gguf.GGML_QUANT_SIZES[Q.IQ4_NL][0]
    raw = np.zeros((96, 64 // block_size * block_bytes), dtype=np.uint8)
    writer.add_tensor("token_embd.weight", raw, raw_dtype=Q.IQ4_NL)
    _finish(writer)
    with pytest.raises(CheckpointError, match=r"'token_embd.weight' is stored as IQ4_NL.*supported: .*Q4_1"):
        open_checkpoint(path)


def test_truncated_file_is_refused(tmp_path, tiny_llama):
    path = write_gguf(tmp_path / "m.gguf", tiny_llama, "llama")
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 1000)
    with pytest.raises(CheckpointError, match=r"m\.gguf.*(truncated|not a readable GGUF)"):
        open_checkpoint(path)


def test_header_cut_short_is_a_config_error(tmp_path, tiny_llama):
    path = write_gguf(tmp_path / "m.gguf", tiny_llama, "llama")
    with open(path, "r+b") as f:
        f.truncate(300)
    with pytest.raises(MalformedConfig, match=r"is not a readable GGUF file"):
        ModelConfig.from_pretrained(path)


def test_tensor_offset_past_the_end_is_refused(tmp_path, tiny_llama):
    """A tensor info pointing outside the data section (a corrupt header)."""
    path = write_gguf(tmp_path / "m.gguf", tiny_llama, "llama")
    field = gguf.GGUFReader(path).tensors[0].field
    offset_at = field.offset + sum(part.nbytes for part in field.parts[:-1])
    with open(path, "r+b") as f:
        f.seek(offset_at)
        f.write(struct.pack("<Q", path.stat().st_size))
    with pytest.raises(CheckpointError, match=r"m\.gguf.*(offsets are wrong|not a readable GGUF)"):
        open_checkpoint(path)


def test_two_gguf_files_in_one_folder_are_ambiguous(tmp_path, tiny_llama):
    write_gguf(tmp_path / "a.gguf", tiny_llama, "llama")
    shutil.copy(tmp_path / "a.gguf", tmp_path / "b.gguf")
    with pytest.raises(MissingConfigFile, match=r"several model files \(a\.gguf, b\.gguf\); pass one file"):
        ModelConfig.from_pretrained(tmp_path)


def test_folder_with_only_a_gguf_says_to_install_the_plugin(tmp_path, tiny_llama):
    """Without kernelbay-gguf the folder is still recognised as a GGUF model, and the error says what to install."""
    write_gguf(tmp_path / "model.gguf", tiny_llama, "llama")
    env = {**os.environ, "KERNELBAY_DISABLE_PLUGINS": "kernelbay-gguf"}
    cli = [sys.executable, "-m", "kernelbay.cli", "explain", str(tmp_path)]
    done = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == MissingConfigFile.exit_code, done.stderr
    assert "model.gguf' is a gguf file, but no weight format can open it" in done.stderr
    assert "kernelbay-gguf" in done.stderr


# ---- the tensor table against the data (issue 28: a retyped tensor ran with garbage) ---------------------------
@dataclass(frozen=True)
class _Entry:
    """One tensor of the table: where its type field lies, and what it declares."""

    name: str
    type_at: int
    qtype: Q
    row: int  # values per row (the innermost dimension)
    elements: int
    nbytes: int
    start: int


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory, tiny_llama) -> tuple[bytes, list[_Entry]]:
    """The tiny Llama as GGUF bytes, and its tensor table (read once: writing and parsing cost seconds)."""
    path = write_gguf(tmp_path_factory.mktemp("table") / "m.gguf", tiny_llama, "llama")
    entries = [
        _Entry(t.name, _type_offset(t.field), Q(t.tensor_type), int(t.shape[0]), int(t.n_elements), int(t.n_bytes),
               int(t.data_offset))
        for t in gguf.GGUFReader(path).tensors
    ]  # fmt: skip
    return path.read_bytes(), sorted(entries, key=lambda e: e.start)


def _type_offset(field) -> int:
    return field.offset + sum(part.nbytes for part in field.parts[:-2])  # name, n_dims, dims, then type, offset


def _retyped(llama_gguf, folder, name: str, qtype: Q):
    """A copy of the file with one tensor's ggml type rewritten in the table, its bytes left as they are."""
    data, entries = llama_gguf
    at = next(e.type_at for e in entries if e.name == name)
    path = folder / "m.gguf"
    path.write_bytes(data[:at] + struct.pack("<I", int(qtype)) + data[at + 4 :])
    return path


@pytest.mark.parametrize("qtype", [Q.F16, Q.Q4_1, Q.Q8_0], ids=lambda q: q.name)
def test_retyped_norm_is_refused_naming_it(tmp_path, llama_gguf, qtype):
    """blk.0.attn_norm.weight declared F16 / Q4_1 / Q8_0 over its F32 bytes: it no longer fills its space."""
    path = _retyped(llama_gguf, tmp_path, "blk.0.attn_norm.weight", qtype)
    expected = rf"m\.gguf: tensor 'blk\.0\.attn_norm\.weight' is declared {qtype.name} \[64\].*next tensor"
    with pytest.raises(CheckpointError, match=expected):
        open_checkpoint(path)


def test_retyped_last_tensor_is_refused_against_the_file_end(tmp_path, llama_gguf):
    """The last tensor has no next one: its declared size is checked against where the file ends."""
    last = llama_gguf[1][-1].name
    path = _retyped(llama_gguf, tmp_path, last, Q.F16)
    with pytest.raises(CheckpointError, match=rf"'{re.escape(last)}' is declared F16 .* the file leaves it"):
        open_checkpoint(path)


def test_retyped_tensor_is_refused_by_the_model_load_too(tmp_path, llama_gguf):
    """What LLM and `kernelbay run` reach: the load refuses before any weight is read (exit 9, CheckpointError)."""
    from kernelbay_engine import AutoModelForCausalLM

    path = _retyped(llama_gguf, tmp_path, "blk.0.attn_norm.weight", Q.F16)
    with pytest.raises(CheckpointError, match=r"attn_norm\.weight' is declared F16"):
        AutoModelForCausalLM.from_pretrained(path, progress=False)


def test_rows_not_a_multiple_of_the_block_are_refused(tmp_path, llama_gguf):
    """A weight of 64-value rows declared Q4_K (blocks of 256 values): refused before its size is trusted."""
    path = _retyped(llama_gguf, tmp_path, "blk.0.attn_q.weight", Q.Q4_K)
    with pytest.raises(CheckpointError, match=r"'blk\.0\.attn_q\.weight' is Q4_K with rows of 64 values"):
        open_checkpoint(path)


def _padded(nbytes: int) -> int:
    return -(-nbytes // gguf.GGUF_DEFAULT_ALIGNMENT) * gguf.GGUF_DEFAULT_ALIGNMENT


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_retype_that_changes_a_tensors_space_is_refused(data, tmp_path_factory, llama_gguf):
    """Fuzz: any tensor retyped to any readable type; unless its declared size pads to the same space (F16 <->
    BF16: the header alone cannot tell), the table no longer tiles the data and the file is refused, naming it."""
    entry = data.draw(st.sampled_from(llama_gguf[1]), label="tensor")
    qtype = data.draw(st.sampled_from(sorted(SUPPORTED_TYPES - {entry.qtype}, key=int)), label="type")
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    fits = entry.row % block == 0 and _padded(entry.elements // block * block_bytes) == _padded(entry.nbytes)
    path = _retyped(llama_gguf, tmp_path_factory.mktemp("retype"), entry.name, qtype)
    if fits:
        open_checkpoint(path)  # indistinguishable from a file written that way
        return
    with pytest.raises(CheckpointError, match=re.escape(entry.name)):
        open_checkpoint(path)


def test_real_llama_cpp_file_tiles_exactly(smollm2):
    """SmolLM2's Q4_1 file from llama.cpp (272 tensors, alignment 32) passes the table check unchanged."""
    assert len(open_checkpoint(smollm2).names) == 272
