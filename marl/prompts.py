"""The text every agent reads: one place that formats prompts, so the environment and the
cost model can never disagree.

An agent's prompt is a growing transcript::

    you are w1 (worker). value: 7          <- header: identity and private information
    Report your value to the lead.         <- the scenario's prompt (omitted when empty)
    [round 1]                              <- turn: round marker ...
    lead> ?7??                             <- ... one line per message read ...
    w1> 7???                               <- ... the query, then the agent's completion
    [round 2]
    ...

The final call of an answer agent ends with ``w1 answer> `` instead of ``w1> ``.
"""

from __future__ import annotations

from marl.tokenizer import CHARSET

_ALLOWED = frozenset(CHARSET)


def header(agent: str, role: str, private: str, prompt: str) -> str:
    """Identity and private information on the first line, then the scenario's prompt."""
    text = f"you are {agent} ({role}). {private}\n"
    return text + (f"{prompt}\n" if prompt else "")


def turn_open(rnd: int) -> str:
    """Round marker; from round 2 on it first ends the line of the previous completion."""
    return f"[round {rnd + 1}]\n" if rnd == 0 else f"\n[round {rnd + 1}]\n"


def message_line(src: str, message: str) -> str:
    """How a message from ``src`` appears in the reader's prompt."""
    return f"{src}> {message}\n"


def query(agent: str, final: bool) -> str:
    """The text the agent completes."""
    return f"{agent} answer> " if final else f"{agent}> "


def waiting(agent: str, rnd: int, layer: int) -> str:
    """Observation of an agent that is not scheduled in the current layer."""
    return f"{agent}: not scheduled in round {rnd + 1}, layer {layer + 1}; action ignored."


def sanitize(text: str) -> tuple[str, int]:
    """Make ``text`` a one-line message over :data:`CHARSET`.

    Newlines become spaces (a message is one line, so it cannot forge other lines of the
    reader's prompt) and any other character outside the charset becomes ``?``. Returns
    the text and how many characters were replaced.

    >>> sanitize("hi\\nthere\\u00e9")
    ('hi there?', 2)
    """
    out = []
    replaced = 0
    for c in text:
        if c == "\n":
            out.append(" ")
            replaced += 1
        elif c in _ALLOWED:
            out.append(c)
        else:
            out.append("?")
            replaced += 1
    return "".join(out), replaced


def one_line(text: str) -> str:
    """A scenario prompt as a single line (newlines become spaces)."""
    return text.replace("\n", " ").strip()
