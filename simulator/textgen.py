"""What the twin "writes": fixed prose and code passages, pre-tokenized once.

An answer is a run of consecutive tokens of the passage of its kind, starting at a line start
chosen from the request's hash. Each token's JSON string is encoded once here, so streaming a
token costs a bytes concatenation, not a json.dumps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from simulator.model import Kind
from simulator.tokens import Tokenizer

_PROSE = """Thanks for the question! Here is a short overview of how it works.
The idea is simple: a small draft head guesses the next few tokens, and the large model checks \
all of them in a single pass. When the guesses are right, several tokens arrive for the price of \
one step; when they are wrong, the work on them is thrown away and only one token comes out.
That is why the gain depends so much on the text. Greetings, lists and well known phrases are \
easy to guess, so most drafts are accepted. Creative writing, rare names and long reasoning are \
harder, and many drafts are rejected.
The length of the context matters too. Every verification step attends over the whole history, \
so with a very long conversation each extra drafted token costs more, and the head itself also \
guesses worse.
In practice it helps to try a few settings on your own work and keep the one that is fastest. \
Let me know if you would like a worked example or some numbers from a real run.
"""

_CODE = '''import random
import sys
from dataclasses import dataclass, field


@dataclass
class Game:
    """A tiny number guessing game."""

    low: int = 1
    high: int = 100
    tries: int = 0
    secret: int = field(default_factory=lambda: random.randint(1, 100))

    def guess(self, value: int) -> str:
        self.tries += 1
        if value < self.secret:
            return "higher"
        if value > self.secret:
            return "lower"
        return "correct"


def read_number(prompt: str) -> int | None:
    text = input(prompt).strip()
    if not text.isdigit():
        print("Please type a whole number.")
        return None
    return int(text)


def main(argv: list[str]) -> int:
    game = Game()
    print(f"Guess a number between {game.low} and {game.high}.")
    while True:
        value = read_number("> ")
        if value is None:
            continue
        answer = game.guess(value)
        if answer == "correct":
            print(f"Well done! You needed {game.tries} tries.")
            return 0
        print(f"Try {answer}.")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
'''


@dataclass(frozen=True)
class Passage:
    texts: tuple[str, ...]
    ids: tuple[int, ...]
    quoted: tuple[bytes, ...]  # json.dumps(text) of each token, UTF-8
    starts: tuple[int, ...]  # token indices that begin a line

    def text(self, start: int, count: int) -> str:
        n = len(self.texts)
        return "".join(self.texts[(start + i) % n] for i in range(count))

    def token_ids(self, start: int, count: int) -> list[int]:
        n = len(self.ids)
        return [self.ids[(start + i) % n] for i in range(count)]


def _passage(tokenizer: Tokenizer, source: str) -> Passage:
    texts = tokenizer.pieces(source)
    ids = tuple(tokenizer.token_id(t) for t in texts)
    starts = tuple(i for i, t in enumerate(texts) if i == 0 or texts[i - 1].endswith("\n"))
    quoted = tuple(json.dumps(t, ensure_ascii=False).encode() for t in texts)
    return Passage(tuple(texts), ids, quoted, starts)


class OutputText:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._by_kind = {
            Kind.PROSE: _passage(tokenizer, _PROSE),
            Kind.CODE: _passage(tokenizer, _CODE),
        }

    def passage(self, kind: Kind) -> Passage:
        return self._by_kind[kind]

    def fixed(self, text: str) -> Passage:
        """A passage of exactly ``text`` (an answer the request's form fixes: JSON)."""
        return _passage(self._tokenizer, text)
