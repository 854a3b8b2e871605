"""kernelbay_gguf.header against the gguf package's own GGUFReader on the same files: the same metadata (arrays
as their lengths) and the same tensor table; and a clear error for each kind of bad header."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from kernelbay_gguf.header import HeaderError, read_header


def _reference(path):
    reader = gguf.GGUFReader(path)
    metadata = {
        key: len(field.data) if field.types[0] == gguf.GGUFValueType.ARRAY else field.contents()
        for key, field in reader.fields.items()
        if not key.startswith("GGUF.")
    }
    tensors = [
        (t.name, t.tensor_type, tuple(int(d) for d in t.shape), int(t.data_offset), int(t.n_bytes))
        for t in reader.tensors
    ]
    return metadata, tensors


def _assert_same_as_gguf_reader(path):
    metadata, tensors = _reference(path)
    header = read_header(path)
    assert header.metadata == metadata
    assert [(t.name, t.qtype, t.dims, t.start, t.nbytes) for t in header.tensors] == tensors


CASES = [("llama", q) for q in (Q.F32, Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0)] + [
    ("qwen2moe", Q.F32),
    ("gemma2", Q.F32),
]


@pytest.mark.parametrize(("name", "qtype"), CASES, ids=[f"{n}-{q.name}" for n, q in CASES])
def test_header_is_what_gguf_reader_reads(tiny_gguf, name, qtype):
    _assert_same_as_gguf_reader(tiny_gguf(name, qtype))


def test_every_value_type_and_a_custom_alignment(tmp_path):
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint8("t.u8", 7)
    writer.add_int16("t.i16", -3)
    writer.add_int64("t.i64", -(2**40))
    writer.add_float64("t.f64", 0.1)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "Ünïcode ✓")
    writer.add_array("t.ints", [1, 2, 3])
    writer.add_array("t.strs", ["a", "bb", ""])
    writer.add_uint32("general.alignment", 64)
    writer.add_tensor("a.weight", np.ones((3, 5), dtype="float32"))
    writer.add_tensor("b.weight", np.ones((2, 32), dtype="float16"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _assert_same_as_gguf_reader(path)
    header = read_header(path)
    assert header.metadata["t.strs"] == 3 and header.metadata["t.str"] == "Ünïcode ✓"
    assert all(t.start % 64 == 0 for t in header.tensors)


def _header_bytes(tensors: int = 0, kvs: int = 0, version: int = 3) -> bytes:
    return struct.pack("<IIQQ", gguf.GGUF_MAGIC, version, tensors, kvs)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GGML" + bytes(20), "does not start with the GGUF magic bytes"),
        (_header_bytes(version=1), "GGUF version 1 is not supported"),
        (_header_bytes(kvs=1)[:20], "the header ends early"),
        (_header_bytes(kvs=1) + struct.pack("<Q", 10**9), "a string of 1000000000 bytes .* runs past the end"),
        (
            _header_bytes(kvs=1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 42),
            "value type 42 .* not a GGUF type",
        ),
        (
            _header_bytes(kvs=1) + struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 4, 10**6),
            "an array of 1000000 items runs past the end",
        ),
        (
            _header_bytes(tensors=1) + struct.pack("<Q", 1) + b"t" + struct.pack("<IQIQ", 1, 32, 99, 0),
            "tensor 't' has ggml type 99, which the gguf package does not know",
        ),
    ],
    ids=["magic", "version", "short", "string", "value type", "array", "tensor type"],
)
def test_bad_headers_are_named(tmp_path, data, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(HeaderError, match=message):
        read_header(path)


def test_alignment_must_be_a_power_of_two(tmp_path):
    path = tmp_path / "m.gguf"
    entry = struct.pack("<Q", 17) + b"general.alignment" + struct.pack("<II", 4, 48)
    path.write_bytes(_header_bytes(kvs=1) + entry)
    with pytest.raises(HeaderError, match=r"general\.alignment 48 is not a power of two"):
        read_header(path)


def test_a_load_walks_the_header_once(smollm2, monkeypatch):
    """`LLM(FILE)` (config, tokenizer, tensors, codes) walks SmolLM2's header once: the tokenizer reads its
    vocabulary from where that walk found it (kernelbay_gguf.header.read_arrays), not by parsing the file again."""
    from kernelbay_gguf import header, parsed

    from kernelbay_engine import LLM

    walks = []
    entry = header._tensor_entry  # each walk reads the tensor table, one entry per tensor
    monkeypatch.setattr(header, "_tensor_entry", lambda cursor: walks.append(1) or entry(cursor))
    parsed._parse.cache_clear()  # a parse of an earlier test would be served from the cache
    llm = LLM(smollm2, max_num_seqs=1)
    assert len(walks) == len(parsed.read_gguf(smollm2).tensors)
    assert llm.tokenizer is not None and len(llm.tokenizer.hf) == 49152


def test_arrays_are_read_from_where_the_header_walk_found_them(tmp_path):
    """read_arrays gives each named array whole (strings and numbers), skips names the file lacks, and refuses an
    array whose length is not the one parsed (the file changed since)."""
    from kernelbay_gguf.header import read_arrays

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_array("t.strs", ["a", "Ünï", ""])
    writer.add_uint32("t.u32", 7)
    writer.add_array("t.ints", [1, -2, 3])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = read_header(path)
    arrays = read_arrays(path, ("t.ints", "t.strs", "t.none"), header.arrays, header.metadata)
    assert arrays == {"t.ints": [1, -2, 3], "t.strs": ["a", "Ünï", ""]}
    with pytest.raises(HeaderError, match=r"t\.ints holds 3 items where the header said 4: the file changed"):
        read_arrays(path, ("t.ints",), header.arrays, {**header.metadata, "t.ints": 4})
