"""Cheap deterministic tokenizer and the content-kind ground truth.

Tokenizer rule (documented in MODEL.md): text is split on special tags (`<|im_start|>` ...), then
into GPT-2-like pieces (a word with its leading space, up to 3 digits, a run of punctuation, a run
of whitespace); a word piece costs one token per 6 characters, a punctuation run one per 3, a
whitespace run one per 8. That gives ~3.9 characters per token on English prose and ~3.3 on code.
Splitting is local, so tokenizing a longer text that extends a shorter one at a piece boundary
extends its token list: the prefix cache works across chat turns.
Token ids are crc32 of the token text modulo the vocabulary size (stable across processes).
"""

from __future__ import annotations

import re
import zlib
from collections import OrderedDict

from simulator.model import Kind

_SPECIAL = re.compile(r"(<\|[a-z_]+\|>)")
_PIECE = re.compile(r" ?[A-Za-z]+| ?\d{1,3}| ?[^\sA-Za-z\d]+|\s+(?!\S)|\s+")
_WORD_CHARS = 6
_PUNCT_CHARS = 3
_SPACE_CHARS = 8
_VOCAB_MEMORY = 1 << 18  # id -> text entries kept for /detokenize
# Segments (text between special tags: one chat message) are re-sent on every turn of a
# conversation; remembering their ids makes a 100k-token prompt cost milliseconds, not 150 ms of
# event-loop time (which a time-scaled run would count as simulated seconds).
_SEGMENT_MIN_CHARS = 256
_SEGMENT_MEMORY_CHARS = 4_000_000


def _chunk_size(piece: str) -> int:
    head = piece[1:2] if piece[:1] == " " and len(piece) > 1 else piece[:1]
    if head.isspace():
        return _SPACE_CHARS
    if head.isascii() and head.isalpha():
        return _WORD_CHARS
    if head.isdigit():
        return 3
    return _PUNCT_CHARS


class Tokenizer:
    """Text <-> token ids. Holds the id -> text memory that /detokenize needs."""

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self._pieces: dict[str, tuple[int, ...]] = {}
        self._texts: dict[int, str] = {}
        self._segments: OrderedDict[str, tuple[int, ...]] = OrderedDict()  # LRU
        self._segment_chars = 0

    def token_id(self, text: str) -> int:
        """Id of one token's text."""
        tid = zlib.crc32(text.encode()) % self.n_vocab
        if len(self._texts) < _VOCAB_MEMORY:
            self._texts.setdefault(tid, text)
        return tid

    def _piece_ids(self, piece: str) -> tuple[int, ...]:
        ids = self._pieces.get(piece)
        if ids is None:
            size = _chunk_size(piece)
            ids = tuple(self.token_id(piece[i : i + size]) for i in range(0, len(piece), size))
            if len(self._pieces) < _VOCAB_MEMORY:
                self._pieces[piece] = ids
        return ids

    def pieces(self, text: str) -> list[str]:
        """Token texts of `text` (their concatenation is `text`)."""
        out: list[str] = []
        for segment in _SPECIAL.split(text):
            if not segment:
                continue
            if _SPECIAL.fullmatch(segment):
                out.append(segment)
                continue
            for piece in _PIECE.findall(segment):
                size = _chunk_size(piece)
                out.extend(piece[i : i + size] for i in range(0, len(piece), size))
        return out

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for segment in _SPECIAL.split(text):
            if not segment:
                continue
            if _SPECIAL.fullmatch(segment):
                ids.append(self.token_id(segment))
            elif len(segment) >= _SEGMENT_MIN_CHARS:
                ids.extend(self._segment_ids(segment))
            else:
                for piece in _PIECE.findall(segment):
                    ids.extend(self._piece_ids(piece))
        return ids

    def _segment_ids(self, segment: str) -> tuple[int, ...]:
        cached = self._segments.get(segment)
        if cached is not None:
            self._segments.move_to_end(segment)
            return cached
        ids: list[int] = []
        for piece in _PIECE.findall(segment):
            ids.extend(self._piece_ids(piece))
        result = tuple(ids)
        self._segments[segment] = result
        self._segment_chars += len(segment)
        while self._segment_chars > _SEGMENT_MEMORY_CHARS and len(self._segments) > 1:
            old, _ = self._segments.popitem(last=False)
            self._segment_chars -= len(old)
        return result

    def token_text(self, tid: int) -> str:
        return self._texts.get(tid, "")

    def decode(self, ids: list[int]) -> str:
        return "".join(self._texts.get(t, "") for t in ids)


# --- content kind: the simulator's ground truth -------------------------------------------------

_CODE_MARKERS = (
    "```",
    "def ",
    "class ",
    "import ",
    "return ",
    "function ",
    "const ",
    "=> ",
    "#include",
    "diff --git",
    "\n@@ ",
    "\n+++ ",
    "\n--- ",
    "();",
    "{\n",
    "};",
    "<tool_response>",
)
_CODE_REQUEST = re.compile(
    r"\b(write|implement|fix|refactor|debug|code|patch)\b.{0,80}?"
    r"\b(code|function|script|program|class|method|game|bug|test|python|javascript|typescript"
    r"|rust|golang|java|sql|bash|c\+\+|html|css|api)\b",
    re.IGNORECASE | re.DOTALL,
)
_CODE_DENSITY = 2.0  # markers per 1,000 characters


def content_kind(prompt: str, last_user: str) -> Kind:
    """Code when the prompt carries code (fences, keywords, diffs, tool results) or asks for it."""
    if _CODE_REQUEST.search(last_user[-2000:]):
        return Kind.CODE
    hits = sum(prompt.count(marker) for marker in _CODE_MARKERS)
    per_k = 1000.0 * hits / max(1, len(prompt))
    return Kind.CODE if per_k >= _CODE_DENSITY else Kind.PROSE
