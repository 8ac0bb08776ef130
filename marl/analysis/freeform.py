"""Free-form message metrics: how long the messages are, how varied their words, and how
often they come out empty or cut at the token limit.

For tasks whose messages are natural-language text (``Task.messages == "text"``), where
the symbol-code metrics of :mod:`marl.analysis.emergence` (one character, one symbol) say
little; they are as cheap for codes. Plain functions over strings and transcript entries.
Characters are Unicode code points (``len`` of the str), words are the lower-cased runs of
non-whitespace (``str.split()``), and entropies are in BITS.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from marl.analysis.emergence import entropy


def _words(message: str) -> list[str]:
    """The message's words, lower-cased; lines and runs of spaces separate them alike.

    >>> _words("The red\\n\\nCUBE  ok.")
    ['the', 'red', 'cube', 'ok.']
    """
    return message.lower().split()


def message_lengths(messages: Sequence[str]) -> dict[str, float]:
    """Mean and max characters per message and mean words per message. An empty message
    counts as 0 of each. Raises ValueError when there are no messages (no mean).

    >>> message_lengths(["red cube", "", "go\\nleft", "déjà vu"])
    {'mean_chars': 5.5, 'max_chars': 8, 'mean_words': 1.5}
    """
    if len(messages) == 0:
        raise ValueError("message_lengths of no messages is undefined (the sequence is empty).")
    chars = [len(m) for m in messages]
    return {"mean_chars": sum(chars) / len(chars), "max_chars": max(chars),
            "mean_words": sum(len(_words(m)) for m in messages) / len(messages)}


def vocabulary_entropy(messages: Sequence[str]) -> float:
    """Plug-in entropy in bits of the word distribution pooled over all messages (every
    occurrence counts; words as in :func:`message_lengths`, lower-cased); 0.0 when the
    messages hold no word. A team repeating one sentence of k distinct words scores
    log2(k), however often it says it; whole-message entropy would score 0.

    >>> vocabulary_entropy(["Red cube", "red\\nball"])  # red 1/2, cube 1/4, ball 1/4
    1.5
    >>> vocabulary_entropy(["", "  \\n"])
    0.0
    """
    words = [w for m in messages for w in _words(m)]
    return entropy(words) if words else 0.0


def empty_or_cut_share(transcript_entries: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The share of messages that are empty (flagged ``empty`` by the environment, or with
    no text) and the share cut at the token limit: the policy stopped at
    ``max_new_tokens`` (``finish == "length"``, model policies) or the environment cut the
    text to it (``flags.truncated_from``). Raises ValueError when there are no entries.

    >>> empty_or_cut_share([{"message": "hi", "flags": {}, "finish": "eos"},
    ...                     {"message": "", "flags": {"empty": True}, "finish": "eos"},
    ...                     {"message": "The cube", "flags": {}, "finish": "length"},
    ...                     {"message": "abc", "flags": {"truncated_from": 40}}])
    {'empty_share': 0.25, 'cut_share': 0.5}
    """
    n = len(transcript_entries)
    if n == 0:
        raise ValueError("empty_or_cut_share of no messages is undefined (no entries).")
    empty = cut = 0
    for entry in transcript_entries:
        flags = entry.get("flags", {})  # records written before flags have none
        empty += bool(flags.get("empty")) or entry["message"] == ""
        cut += entry.get("finish") == "length" or "truncated_from" in flags
    return {"empty_share": empty / n, "cut_share": cut / n}
