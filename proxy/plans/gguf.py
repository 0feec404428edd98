"""What a GGUF file says about itself: architecture, trained context, MTP layers, KV shape.

Read with the `gguf` package (llama.cpp's own reader), never by hand. Its reader makes a numpy
view of every element of every array: on a 250k-token vocabulary (Qwen3.5/3.6) that took 17.6 s
and 850 MB here. The arrays (the vocabulary, the merges) are not needed, so `_MetadataReader`
steps over them (0.2 s, 45 MB on the same file); should a future `gguf` change the method it
overrides, the plain reader is used. Blocking: at start-up, `check-config` and `init`. `gguf`
and numpy are imported when a file is read (a quarter of a second), not with the module.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
    try:
        reader = _open(path)
    except OSError as exc:
        raise GgufError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise GgufError(f"{path} is not a GGUF file ({exc})") from None
    fields = {name: _value(field) for name, field in reader.fields.items()}
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise GgufError(f"{path} names no general.architecture")

    def number(key: str) -> int | None:
        value = fields.get(f"{arch}.{key}")
        return (
            int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        )

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


def _open(path: Path) -> Any:
    from gguf import GGUFReader  # numpy with it: imported when a file is read, not at start-up

    try:
        return metadata_reader()(path)
    except (AttributeError, NotImplementedError):  # the overridden method changed: read it all
        return GGUFReader(path)


@functools.cache
def metadata_reader() -> type[Any]:
    """The gguf package's reader, stepping over arrays instead of viewing each element."""
    import numpy as np
    from gguf import GGUFReader, GGUFValueType

    class MetadataReader(GGUFReader):
        def _get_field_parts(
            self, orig_offs: int, raw_type: int
        ) -> tuple[int, list[Any], list[int], list[GGUFValueType]]:
            if raw_type != GGUFValueType.ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            item_type = self._get(orig_offs, np.uint32)
            length = self._get(orig_offs + 4, np.uint64)
            kind, count, offs = GGUFValueType(int(item_type[0])), int(length[0]), orig_offs + 12
            types = [GGUFValueType.ARRAY, kind]
            if kind == GGUFValueType.STRING:
                data = memoryview(self.data.data)
                for _ in range(count):  # each string: an uint64 length, then its bytes
                    offs += 8 + int.from_bytes(data[offs : offs + 8], "little")
                return offs - orig_offs, [item_type, length], [], types
            scalar = self.gguf_scalar_to_np.get(kind)
            if scalar is None:  # nested arrays: none in the metadata the proxy reads
                raise NotImplementedError(f"array of {kind.name}")
            values = self._get(offs, scalar, count)
            return 12 + int(values.nbytes), [item_type, length, values], [2], types

    return MetadataReader


def _value(field: Any) -> object:
    """A scalar or string field's value; arrays (the vocabulary) are not needed: None."""
    from gguf import GGUFValueType

    if not field.types or not field.data:
        return None
    kind = field.types[0]
    part = field.parts[field.data[0]]
    if kind == GGUFValueType.STRING:
        return bytes(part).decode("utf-8", errors="replace")
    if kind == GGUFValueType.ARRAY:
        return None
    return part[0].item()
