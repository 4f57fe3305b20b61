"""Read a CTranslate2 `model.bin` into numpy arrays, without the ctranslate2 package.

Layout (ctranslate2/specs/model_spec.py, `_serialize`): u32 binary version, string spec name, u32 revision,
u32 variable count, then per variable: string name, u8 rank, u32 per dim, u8 dtype id, u32 byte count, raw
bytes; then u32 alias count and (alias, target) string pairs. A string is u16 length (with the NUL), bytes, NUL.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

# dtype ids in the order of CTranslate2's DataType enum (include/ctranslate2/types.h)
_DTYPES = (np.float32, np.int8, np.int16, np.int32, np.float16, None)  # 5 = bfloat16: numpy has none
SUPPORTED_BINARY_VERSIONS = (5, 6)


class Ct2FormatError(ValueError):
    """The file is not a CTranslate2 model this reader understands."""


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.offset = data, 0

    def unpack(self, fmt: str):
        value = struct.unpack_from("<" + fmt, self.data, self.offset)[0]
        self.offset += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        length = self.unpack("H")
        text = self.data[self.offset:self.offset + length - 1].decode("utf-8")
        self.offset += length
        return text

    def raw(self, count: int) -> bytes:
        chunk = self.data[self.offset:self.offset + count]
        self.offset += count
        return chunk


def read_ct2(parts: list[Path]) -> tuple[str, dict[str, np.ndarray]]:
    """(spec name, {variable name: array}) from a model.bin split into parts (read in order, joined in memory);
    aliases resolve to their targets' arrays."""
    path = parts[0]
    reader = _Reader(b"".join(Path(p).read_bytes() for p in parts))
    version = reader.unpack("I")
    if version not in SUPPORTED_BINARY_VERSIONS:
        raise Ct2FormatError(f"{path}: CTranslate2 binary version {version} is not supported "
                             f"(this reader knows {SUPPORTED_BINARY_VERSIONS})")
    spec = reader.string()
    reader.unpack("I")  # spec revision: the Whisper layout is the same across revisions 2-3
    variables: dict[str, np.ndarray] = {}
    for _ in range(reader.unpack("I")):
        name = reader.string()
        shape = [reader.unpack("I") for _ in range(reader.unpack("B"))]
        dtype_id = reader.unpack("B")
        nbytes = reader.unpack("I")
        if dtype_id >= len(_DTYPES) or _DTYPES[dtype_id] is None:
            raise Ct2FormatError(f"{path}: variable {name} has dtype id {dtype_id} (bfloat16/unknown), not supported")
        variables[name] = np.frombuffer(reader.raw(nbytes), dtype=_DTYPES[dtype_id]).reshape(shape)
    for _ in range(reader.unpack("I")):
        alias, target = reader.string(), reader.string()
        variables[alias] = variables[target]
    return spec, variables
