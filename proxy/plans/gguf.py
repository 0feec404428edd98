"""What a GGUF file says about itself: architecture, trained context, MTP layers, KV shape.

Read by a small reader of its own (``_Reader``), of the header, the metadata and the tensor
infos only, and bounded: every length and count is checked against the bytes left in the file
before anything is read or looped over. The gguf package's reader memory-maps the file and
trusts its counts: a 170-byte file whose string array claimed 2^62 items hung `init`,
`check-config` and `serve` at 100 % CPU, a 200-byte one claiming 2^61 numbers was accepted, and a
truncated file got numpy's words ("index 0 is out of bounds for axis 0 with size 0"). Here a
count no file could hold is "not a GGUF file (...)", bytes that end before the structure they
began (the header's, or the tensor data the infos place) "truncated GGUF (download
incomplete?)", each in about a second on the largest vocabulary (250k tokens: a loop over its
strings' lengths, nothing copied). Blocking: at start-up, `check-config` and `init`. The format:
llama.cpp's docs/gguf.md (the gguf package's constants give the tensor types' sizes).
"""

from __future__ import annotations

import math
import mmap
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path


class GgufError(Exception):
    """The file cannot be read as a GGUF; the message says why."""


@dataclass(frozen=True)
class GgufFacts:
    """The metadata the proxy uses. None: the file does not say."""

    architecture: str
    name: str | None
    context_length: int | None  # the trained context: llama-server's -c 0 takes it
    block_count: int | None  # layers, MTP layers included
    mtp_layers: int  # {arch}.nextn_predict_layers: 0 when the file has none
    embedding_length: int | None
    head_count: int | None
    head_count_kv: int | None
    key_length: int | None
    value_length: int | None
    full_attention_interval: int | None  # hybrid models: every n-th layer has a KV cache

    @property
    def has_mtp(self) -> bool:
        return self.mtp_layers > 0

    def kv_layers(self) -> int | None:
        """Layers of the trunk that keep a KV cache (the MTP layers are counted apart)."""
        if self.block_count is None:
            return None
        trunk = self.block_count - self.mtp_layers
        interval = self.full_attention_interval or 1
        return max(math.ceil(trunk / interval), 1)

    def kv_width(self) -> int | None:
        """Values per token per layer of K (and of V): the K/V width with GQA."""
        head = self.key_length
        if head is None and self.embedding_length and self.head_count:
            head = self.embedding_length // self.head_count  # no key_length: n_embd / n_head
        if self.head_count_kv is None or head is None:
            return None
        return self.head_count_kv * max(head, self.value_length or 0)


def read_gguf(path: Path) -> GgufFacts:
    """The facts of one GGUF (the first part of a split one holds them); GgufError if none."""
    fields = read_metadata(path).fields
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise GgufError(f"{path} names no general.architecture")

    def number(key: str) -> int | None:
        value = fields.get(f"{arch}.{key}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return int(value) if math.isfinite(value) else None

    name = fields.get("general.name")
    return GgufFacts(
        architecture=arch,
        name=name if isinstance(name, str) else None,
        context_length=number("context_length"),
        block_count=number("block_count"),
        mtp_layers=number("nextn_predict_layers") or 0,
        embedding_length=number("embedding_length"),
        head_count=number("attention.head_count"),
        head_count_kv=number("attention.head_count_kv"),
        key_length=number("attention.key_length"),
        value_length=number("attention.value_length"),
        full_attention_interval=number("full_attention_interval"),
    )


@dataclass(frozen=True)
class TensorInfo:
    name: str
    kind: int  # ggml type
    shape: tuple[int, ...]
    offset: int  # from the start of the tensor data


@dataclass(frozen=True)
class GgufMetadata:
    """A GGUF's metadata, its tensors' infos and where their data begins. An array is None in
    ``fields`` unless it was asked for (``kept``): its items are then in ``arrays`` (strings as
    bytes); every array's length is in ``array_lengths``."""

    version: int
    fields: dict[str, object]
    tensors: list[TensorInfo]
    data_offset: int
    arrays: dict[str, tuple[object, ...]] = field(default_factory=dict)
    array_lengths: dict[str, int] = field(default_factory=dict)


def read_metadata(path: Path, kept: frozenset[str] = frozenset()) -> GgufMetadata:
    """The header, metadata and tensor infos of ``path``, every count bounded by the file's
    size, and the items of the arrays named in ``kept`` (a vocabulary's tokens: bounded the same
    way); GgufError: not readable, not a GGUF, or truncated (the tensor data included)."""
    try:
        with path.open("rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise GgufError(f"{path} is not a regular file")
            if info.st_size < _HEADER.size:
                raise _Short("the header", _HEADER.size - info.st_size)
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                metadata = _Reader(data, info.st_size, kept).metadata()
    except OSError as exc:
        raise GgufError(f"cannot read {path}: {exc.strerror or exc}") from None
    except _NotGguf as exc:
        raise GgufError(f"{path} is not a GGUF file ({exc})") from None
    except _Short as exc:
        raise GgufError(f"{path}: truncated GGUF (download incomplete?): {exc}") from None
    _check_tensor_data(path, metadata, info.st_size)
    return metadata


class _NotGguf(Exception):
    """The bytes are no GGUF: the message says what is wrong with them."""


class _Short(Exception):
    """The file ends inside a structure it began."""

    def __init__(self, what: str, missing: int) -> None:
        super().__init__(f"it ends {missing} bytes short of {what}")


_HEADER = struct.Struct("<4sIQQ")  # magic, version, tensor count, metadata count
_U64 = struct.Struct("<Q")
_MAGIC = b"GGUF"
_VERSIONS = (2, 3)  # what llama.cpp reads (version 1 had 32-bit counts; gone since 2023)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}
_SCALARS |= {11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_NESTING = 2  # arrays of arrays: none in llama.cpp's files, a few levels allowed
_MAX_DIMS = 4  # GGML_MAX_DIMS
_IMPOSSIBLE = 1 << 40  # bytes a count may claim and still be a truncated file's (1 TiB)
_DEFAULT_ALIGNMENT = 32


class _Reader:
    """The header, metadata and tensor infos from a memory map, each length and count checked
    against the bytes left before it is used."""

    def __init__(self, data: mmap.mmap, size: int, kept: frozenset[str] = frozenset()) -> None:
        self.data, self.size, self.at, self.kept = data, size, 0, kept
        self.arrays: dict[str, tuple[object, ...]] = {}
        self.lengths: dict[str, int] = {}

    def metadata(self) -> GgufMetadata:
        magic, version, n_tensors, n_fields = _HEADER.unpack_from(self.data, 0)
        if magic != _MAGIC:
            raise _NotGguf(f"it begins with {magic!r}, not b'GGUF'")
        if version not in _VERSIONS:
            raise _NotGguf(f"version {version}; llama.cpp reads versions 2 and 3")
        self.at = _HEADER.size
        self.fits(n_fields, 13, "metadata entries")  # key length, type, a byte of value
        fields = {}
        for _ in range(n_fields):
            key = self.string("a metadata key").decode("utf-8", "replace")
            fields[key] = self.value(self.unpack("<I", f"the type of {key}"), key, 0)
        self.fits(n_tensors, 24, "tensor infos")  # name length, dims, type, offset
        tensors = [self.tensor() for _ in range(n_tensors)]
        alignment = fields.get("general.alignment", _DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise _NotGguf(f"general.alignment {alignment!r} is not a power of two")
        data_offset = -(-self.at // alignment) * alignment
        return GgufMetadata(version, fields, tensors, data_offset, self.arrays, self.lengths)

    def fits(self, count: int, least: int, what: str) -> None:
        """``count`` items of at least ``least`` bytes each must fit in the bytes left."""
        needed, left = count * least, self.size - self.at
        if needed > _IMPOSSIBLE:
            raise _NotGguf(f"{count} {what} claimed in a file of {self.size} bytes")
        if needed > left:
            raise _Short(f"its {count} {what}", needed - left)

    def take(self, n: int, what: str) -> int:
        left = self.size - self.at
        if n > left:
            if n > _IMPOSSIBLE:
                raise _NotGguf(f"{what} of {n} bytes claimed in a file of {self.size} bytes")
            raise _Short(what, n - left)
        start, self.at = self.at, self.at + n
        return start

    def unpack(self, fmt: str, what: str) -> int:
        value: int = struct.unpack_from(fmt, self.data, self.take(struct.calcsize(fmt), what))[0]
        return value

    def string(self, what: str) -> bytes:
        length = self.unpack("<Q", what)
        start = self.take(length, what)
        return self.data[start : start + length]

    def value(self, kind: int, key: str, depth: int) -> object:
        """A value of type ``kind``; an array is stepped over (None), or kept when asked for."""
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind], key)
        if kind == _STRING:
            return self.string(key).decode("utf-8", "replace")
        if kind != _ARRAY:
            raise _NotGguf(f"{key} has the unknown value type {kind}")
        item, count = self.unpack("<I", key), self.unpack("<Q", key)
        keep = depth == 0 and key in self.kept
        if depth == 0:
            self.lengths[key] = count
        if item in _SCALARS:
            fmt = _SCALARS[item]
            start = self.take(count * struct.calcsize(fmt), f"the array {key}")
            if keep:
                self.arrays[key] = struct.unpack_from(f"<{count}{fmt[1]}", self.data, start)
        elif item == _STRING:
            self.fits(count, 8, f"strings in {key}")
            if keep:
                self.arrays[key] = tuple(self.string(f"a string in {key}") for _ in range(count))
            else:
                self.skip_strings(count, key)
        elif item == _ARRAY and depth < _MAX_NESTING:
            self.fits(count, 12, f"arrays in {key}")
            for _ in range(count):
                self.value(_ARRAY, key, depth + 1)
        else:
            raise _NotGguf(f"{key} is an array of the unknown or too deep type {item}")
        return None

    def skip_strings(self, count: int, key: str) -> None:
        """Step over ``count`` strings (a vocabulary: 250k of them), checking each length."""
        data, size, at, length_at = self.data, self.size, self.at, _U64.unpack_from
        for _ in range(count):
            if at + 8 > size:
                raise _Short(f"a string in {key}", at + 8 - size)
            (length,) = length_at(data, at)
            at += 8 + length
            if at > size:
                self.at = at - length
                self.take(length, f"a string in {key}")  # says which: impossible or short
        self.at = at

    def tensor(self) -> TensorInfo:
        name = self.string("a tensor name").decode("utf-8", "replace")
        n_dims = self.unpack("<I", f"the tensor {name}")
        if n_dims > _MAX_DIMS:
            raise _NotGguf(f"the tensor {name} has {n_dims} dimensions")
        shape = tuple(self.unpack("<Q", f"the tensor {name}") for _ in range(n_dims))
        kind, offset = self.unpack("<I", name), self.unpack("<Q", name)
        return TensorInfo(name, kind, shape, offset)


def _check_tensor_data(path: Path, metadata: GgufMetadata, size: int) -> None:
    """Truncated if the tensor data the infos place ends past the file's end (a download that
    stopped early: the bulk of a file is its tensor data)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    end = metadata.data_offset
    for tensor in metadata.tensors:
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.kind)]
        except ValueError:
            continue  # a type newer than this gguf package: its size is unknown here
        size_bytes = math.prod(tensor.shape) // block * block_bytes
        end = max(end, metadata.data_offset + tensor.offset + size_bytes)
    if end > size:
        raise GgufError(
            f"{path}: truncated GGUF (download incomplete?): its tensor data ends at byte "
            f"{end}, the file at {size}"
        )


TOKENS = "tokenizer.ggml.tokens"


@dataclass(frozen=True)
class Vocabulary:
    """What llama.cpp compares of a target's and a draft's vocabularies before it drafts."""

    model: str | None  # tokenizer.ggml.model: llama (SPM), gpt2 (BPE), ...
    add_bos: bool | None  # tokenizer.ggml.add_bos_token; None: absent
    add_eos: bool | None
    bos: int | None  # tokenizer.ggml.bos_token_id
    eos: int | None
    tokens: tuple[bytes, ...]  # each token's text, by id


def read_vocabulary(path: Path) -> Vocabulary:
    """The vocabulary of a GGUF, read bounded (a 262k-token one in well under a second)."""
    metadata = read_metadata(path, frozenset({TOKENS}))
    fields = metadata.fields

    def flag(key: str) -> bool | None:
        value = fields.get(f"tokenizer.ggml.{key}")
        return value if isinstance(value, bool) else None

    def token_id(key: str) -> int | None:
        value = fields.get(f"tokenizer.ggml.{key}")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    model = fields.get("tokenizer.ggml.model")
    tokens = metadata.arrays.get(TOKENS, ())
    return Vocabulary(
        model=model if isinstance(model, str) else None,
        add_bos=flag("add_bos_token"),
        add_eos=flag("add_eos_token"),
        bos=token_id("bos_token_id"),
        eos=token_id("eos_token_id"),
        tokens=tuple(t for t in tokens if isinstance(t, bytes)),
    )
