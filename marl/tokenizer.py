"""Tokenizers count the tokens each agent reads and writes, in the agent's own units.

The built-in :class:`CharTokenizer` (the default backend's) maps each character of the
environment's charset to one id, plus a few special ids. HF tokenizers plug in behind the
same :class:`Tokenizer` protocol.
"""

from __future__ import annotations

import string
from typing import Protocol

#: Every character an observation or message may contain. Anything else in an agent's
#: output is replaced by ``?`` (and flagged). A string, not a set: its order fixes ids and
#: keeps gymnasium's seeded ``Text.sample`` identical across processes.
CHARSET = string.digits + string.ascii_letters + string.punctuation + " \n"

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")


class Tokenizer(Protocol):
    name: str
    #: True when ``count(a + b) == count(a) + count(b)`` always holds, so prompt sizes add up.
    prefix_stable: bool
    #: Longest text one token can decode to (bounds observation lengths in characters).
    max_token_chars: int
    #: The characters it encodes one for one (others are unknown to it); None: any Unicode.
    charset: str | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def count(self, text: str) -> int: ...


class CharTokenizer:
    """One token per character of :data:`CHARSET`; other characters map to ``<unk>``.

    >>> tok = CharTokenizer()
    >>> tok.decode(tok.encode("w1> 07"))
    'w1> 07'
    >>> tok.count("hello"), tok.vocab_size
    (5, 100)
    """

    name = "char"
    prefix_stable = True
    max_token_chars = 1

    def __init__(self, charset: str = CHARSET):
        self.charset = charset
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = range(len(SPECIAL_TOKENS))
        offset = len(SPECIAL_TOKENS)
        self._ids = {c: i + offset for i, c in enumerate(charset)}
        # id -> text; special tokens decode to nothing
        self._text = [""] * offset + list(charset)

    @property
    def vocab_size(self) -> int:
        return len(SPECIAL_TOKENS) + len(self.charset)

    def encode(self, text: str) -> list[int]:
        return [self._ids.get(c, self.unk_id) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(self._text.__getitem__, ids))

    def count(self, text: str) -> int:
        return len(text)

    def encode_prompt(self, observation: str) -> list[int]:
        """Model input for an observation: BOS, then the text."""
        return [self.bos_id, *self.encode(observation)]


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token-id lists.

    >>> common_prefix([1, 2, 3], [1, 2, 4, 5])
    2
    """
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
