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

Free-form messages (``Task.messages == "text"``) and private texts may span several lines:
every line after the first starts with :data:`CONTINUATION`, so no line of a message can
pass for another agent's line (a ``src> `` at the start of a line) or a round marker::

    lead> Add the two numbers:
      17 and 25.
"""

from __future__ import annotations

import unicodedata

from marl.tokenizer import CHARSET

_ALLOWED = frozenset(CHARSET)
#: What every continuation line of a multi-line message or private text starts with.
CONTINUATION = "  "
#: Line breaks besides ``\n`` (those ``str.splitlines`` knows): a message's become ``\n``.
_BREAKS = {"\r\n": "\n", **dict.fromkeys("\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029", "\n")}


def framed(text: str) -> str:
    """``text`` with every line after the first indented by :data:`CONTINUATION`.

    >>> framed("one\\nlead> two")
    'one\\n  lead> two'
    """
    return text.replace("\n", "\n" + CONTINUATION)


def header(agent: str, role: str, private: str, prompt: str) -> str:
    """Identity and private information on the first line (a multi-line private text goes
    on in continuation lines), then the scenario's prompt."""
    text = f"you are {agent} ({role}). {framed(private)}\n"
    return text + (f"{prompt}\n" if prompt else "")


def turn_open(rnd: int) -> str:
    """Round marker; from round 2 on it first ends the line of the previous completion."""
    return f"[round {rnd + 1}]\n" if rnd == 0 else f"\n[round {rnd + 1}]\n"


def message_line(src: str, message: str) -> str:
    """How a message from ``src`` appears in the reader's prompt (a multi-line message goes
    on in continuation lines)."""
    return f"{src}> {framed(message)}\n"


def query(agent: str, final: bool) -> str:
    """The text the agent completes."""
    return f"{agent} answer> " if final else f"{agent}> "


def waiting(agent: str, rnd: int, layer: int) -> str:
    """Observation of an agent that is not scheduled in the current layer."""
    return f"{agent}: not scheduled in round {rnd + 1}, layer {layer + 1}; action ignored."


def sanitize_text(text: str, charset: str | None) -> tuple[str, int]:
    """Make ``text`` a free-form message: line breaks of every kind become ``\\n``, other
    control characters and (for a tokenizer with a fixed ``charset``, such as the tiny
    models' characters) characters outside it become ``?``. Returns the text and how many
    characters were changed.

    >>> sanitize_text("caf\\u00e9\\r\\nok\\x07", None)
    ('caf\u00e9\\nok?', 2)
    >>> sanitize_text("caf\\u00e9", CHARSET)
    ('caf?', 1)
    """
    changed = 0
    for old, new in _BREAKS.items():
        if old in text:
            changed += text.count(old)
            text = text.replace(old, new)
    allowed = None if charset is None else frozenset(charset)
    out = []
    for c in text:
        bad = c not in allowed if allowed is not None else (
            c not in "\n\t" and unicodedata.category(c) == "Cc")
        out.append("?" if bad else c)
        changed += bad
    return "".join(out), changed


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


def conversation(observation: str) -> list[dict[str, str]]:
    """An agent's prompt as a chat (a policy's ``prompt_format: chat``): a system message
    (its identity, role, private information and the scenario's prompt), then per round a
    user turn naming who said what (``src: message``) and asking for its message or answer,
    and the agent's own message of that round as an assistant turn; the last user turn is
    the one it answers now. The transcript stays the one source; this only reads it.

    >>> obs = ("you are b (x). v\\n[round 1]\\na> hi\\nb> yo\\n"
    ...        "[round 2]\\na> one\\n  two\\nb answer> ")
    >>> [(m["role"], m["content"]) for m in conversation(obs)]
    [('system', 'you are b (x). v'), ('user', '[round 1]\\na: hi\\nYour message:'), \
('assistant', 'yo'), ('user', '[round 2]\\na: one\\ntwo\\nYour answer:')]
    """
    head, *rounds = observation.split("\n[round ")
    agent = head.removeprefix("you are ").split(" (", 1)[0]  # the header names the agent
    chat = [{"role": "system", "content": head.replace("\n" + CONTINUATION, "\n")}]
    for block in rounds:
        number, _, body = block.partition("]\n")
        heard, own, final = body, "", False
        for query in (f"{agent} answer> ", f"{agent}> "):
            at = body.rfind("\n" + query)  # the query is the round's last line
            at = at + 1 if at >= 0 else (0 if body.startswith(query) else -1)
            if at >= 0:
                heard, own = body[:at], body[at + len(query):]
                final = query.endswith("answer> ")
                break
        lines: list[str] = []
        for line in heard.split("\n"):
            if line.startswith(CONTINUATION) and lines:
                lines[-1] += "\n" + line[len(CONTINUATION):]
            elif "> " in line:
                src, _, text = line.partition("> ")
                lines.append(f"{src}: {text}")
        ask = "Your answer:" if final else "Your message:"
        chat.append({"role": "user", "content": "\n".join([f"[round {number}]", *lines, ask])})
        if own:
            chat.append({"role": "assistant", "content": own})
    return chat


def one_line(text: str) -> str:
    """A scenario prompt as a single line (newlines become spaces)."""
    return text.replace("\n", " ").strip()
