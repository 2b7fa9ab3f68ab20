"""The GGUF file format, read with numpy alone: header, metadata, tensor infos, data.

Introduced in notebooks/15_quantisation (and used from chapter 1 on to read the real model's
tokenizer). GGUF is the single-file format of ggml and llama.cpp (Gerganov et al., the
``ggml/docs/gguf.md`` specification, version 3). A file is, in order, all little-endian:

1. a header: the magic ``b"GGUF"``, ``version`` (uint32; 2 and 3 have 64-bit counts),
   ``tensor_count`` (uint64) and ``metadata_kv_count`` (uint64);
2. ``metadata_kv_count`` key/value pairs: a key (a *string*: uint64 byte length, then
   UTF-8 bytes), a value type (uint32, one of :data:`VALUE_TYPES`), the value. An array
   is an element type (uint32), a count (uint64) and the elements, which may themselves
   be arrays;
3. ``tensor_count`` tensor infos: a name (string), ``n_dims`` (uint32), ``n_dims`` sizes
   (uint64, ggml order: the first is the contiguous axis), a ggml type (uint32, one of
   :data:`GGML_TYPES`) and an offset (uint64) into the data section;
4. padding to ``general.alignment`` bytes (default 32), then the data section, in which
   every tensor starts at a multiple of the alignment.

:func:`read_gguf` parses parts 1-3 from the bytes and memory-maps part 4, so opening a
500 MB file costs the time to read its metadata, and a tensor's bytes are read from disk
only when they are used. Decoding the bytes into numbers is :mod:`.ggml_quants`' job.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["GGML_TYPES", "GGUFFile", "GGUFTensor", "VALUE_TYPES", "block_layout", "read_gguf"]

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

#: GGUF metadata value types: code -> (name, struct format of a scalar, or None).
VALUE_TYPES: dict[int, tuple[str, str | None]] = {
    0: ("UINT8", "<B"), 1: ("INT8", "<b"), 2: ("UINT16", "<H"), 3: ("INT16", "<h"),
    4: ("UINT32", "<I"), 5: ("INT32", "<i"), 6: ("FLOAT32", "<f"), 7: ("BOOL", "<?"),
    8: ("STRING", None), 9: ("ARRAY", None), 10: ("UINT64", "<Q"), 11: ("INT64", "<q"),
    12: ("FLOAT64", "<d"),
}

#: ggml tensor types: code -> (name, weights per block, bytes per block). The sizes follow
#: the block structs of ggml-common.h (for example Q4_1: an fp16 scale d, an fp16 minimum
#: m and 32 four-bit values, 2 + 2 + 16 = 20 bytes for 32 weights). Q8_1, a type ggml uses
#: only inside its matrix products and never stores, is left out.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}
_TYPE_BY_NAME = {name: (code, block, size) for code, (name, block, size) in GGML_TYPES.items()}


def block_layout(qtype: str) -> tuple[int, int]:
    """(weights per block, bytes per block) of the ggml type named ``qtype`` (e.g. "Q4_K")."""
    if not isinstance(qtype, str) or qtype not in _TYPE_BY_NAME:
        raise ValueError(f"unknown ggml type {qtype!r}; known: {sorted(_TYPE_BY_NAME)}")
    _, block, size = _TYPE_BY_NAME[qtype]
    return block, size


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file.

    ``qtype`` is the ggml type name ("F32", "Q4_1", ...); ``shape`` is in numpy order (the
    reverse of the file's ggml order, so the last axis is the contiguous one: a (V, d)
    embedding is stored as d-long rows); ``data`` is the raw bytes, a read-only uint8 view
    of the memory-mapped file, ``n_bytes`` long; ``offset`` is where they start in the file.
    """

    name: str
    qtype: str
    shape: tuple[int, ...]
    offset: int
    data: np.ndarray = field(repr=False)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def n_bytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per weight: 8 * bytes / elements (4.5 for Q4_0, 5.0 for Q4_1...)."""
        return 8 * self.n_bytes / self.n_elements


@dataclass(frozen=True)
class GGUFFile:
    """A parsed GGUF file: ``version``, ``metadata`` (key -> Python value: int, float, bool,
    str, or a list of them), ``tensors`` (name -> :class:`GGUFTensor`, in file order),
    ``alignment``, ``data_offset`` (where the data section starts) and ``path``."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]
    alignment: int
    data_offset: int
    file_size: int

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path.name!r}, version={self.version}, "
                f"architecture={self.architecture!r}, {len(self.metadata)} metadata keys, "
                f"{len(self.tensors)} tensors, {self.file_size:,} bytes)")


class _Cursor:
    """Reads little-endian values from a bytes-like buffer, with errors that say where."""

    def __init__(self, buffer: memoryview, path: Path) -> None:
        self.buffer, self.pos, self.path = buffer, 0, path

    def take(self, n: int, what: str) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.buffer):
            raise ValueError(f"{self.path.name}: truncated GGUF file: {what} needs bytes "
                             f"{self.pos}..{end} but the file has {len(self.buffer)}")
        out = self.buffer[self.pos:end]
        self.pos = end
        return out

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what + " (length)")
        raw = bytes(self.take(n, what))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{self.path.name}: {what} at byte {self.pos - n} is not UTF-8") from e

    def value(self, vtype: int, what: str) -> Any:
        if vtype not in VALUE_TYPES:
            raise ValueError(f"{self.path.name}: unknown metadata value type {vtype} for {what}")
        name, fmt = VALUE_TYPES[vtype]
        if fmt is not None:
            return self.scalar(fmt, what)
        if name == "STRING":
            return self.string(what)
        etype = self.scalar("<I", what + " (array element type)")
        count = self.scalar("<Q", what + " (array length)")
        efmt = VALUE_TYPES.get(etype, ("", None))[1]
        if efmt is not None:  # numbers: one vectorised read, then plain Python values
            size = struct.calcsize(efmt)
            raw = self.take(count * size, what)
            return np.frombuffer(raw, dtype=np.dtype(efmt)).tolist()
        return [self.value(etype, f"{what}[{i}]") for i in range(count)]


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse the GGUF file at ``path``; the tensor data stays memory-mapped (see the module).

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` naming the problem
    for anything that is not a well-formed GGUF file of version 2 or 3: a wrong magic, an
    unknown value or tensor type, a truncated header or data section, a tensor whose byte
    size does not match its shape and type, or one that is not aligned.
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    file_size = path.stat().st_size
    if file_size < 24:
        raise ValueError(f"{path.name}: truncated GGUF file: {file_size} bytes, a header needs 24")
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(mm), path)
    magic = bytes(cur.take(4, "magic"))
    if magic != MAGIC:
        raise ValueError(f"{path.name}: not a GGUF file (magic {magic!r}, expected {MAGIC!r})")
    version = cur.scalar("<I", "version")
    if version not in (2, 3):
        raise ValueError(f"{path.name}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors = cur.scalar("<Q", "tensor_count")
    n_kv = cur.scalar("<Q", "metadata_kv_count")

    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key {i}")
        vtype = cur.scalar("<I", f"type of {key!r}")
        metadata[key] = cur.value(vtype, repr(key))

    infos = []
    for i in range(n_tensors):
        name = cur.string(f"tensor name {i}")
        n_dims = cur.scalar("<I", f"n_dims of {name!r}")
        dims = [cur.scalar("<Q", f"dims of {name!r}") for _ in range(n_dims)]
        code = cur.scalar("<I", f"type of {name!r}")
        offset = cur.scalar("<Q", f"offset of {name!r}")
        if code not in GGML_TYPES:
            raise ValueError(f"{path.name}: tensor {name!r} has unknown ggml type {code}")
        infos.append((name, tuple(reversed(dims)), GGML_TYPES[code], offset))

    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    if alignment < 1 or alignment & (alignment - 1):
        raise ValueError(f"{path.name}: general.alignment={alignment} is not a power of two")
    data_offset = -(-cur.pos // alignment) * alignment  # round up to the alignment

    tensors: dict[str, GGUFTensor] = {}
    for name, shape, (qtype, block, size), offset in infos:
        n = int(np.prod(shape, dtype=np.int64))
        if shape and shape[-1] % block:
            raise ValueError(f"{path.name}: tensor {name!r} of type {qtype} has rows of "
                             f"{shape[-1]} weights, not a multiple of its block of {block}")
        n_bytes = n // block * size
        start = data_offset + offset
        if offset % alignment:
            raise ValueError(f"{path.name}: tensor {name!r} at offset {offset} is not "
                             f"aligned to {alignment} bytes")
        if start + n_bytes > file_size:
            raise ValueError(f"{path.name}: truncated GGUF file: tensor {name!r} needs bytes "
                             f"{start}..{start + n_bytes} but the file has {file_size}")
        if name in tensors:
            raise ValueError(f"{path.name}: tensor name {name!r} appears twice")
        tensors[name] = GGUFTensor(name, qtype, shape, offset, mm[start:start + n_bytes])
    return GGUFFile(path, version, metadata, tensors, alignment, data_offset, file_size)
