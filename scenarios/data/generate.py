"""Write the two small datasets the dataset scenarios play, from a fixed seed (no download).

    python scenarios/data/generate.py          # rewrites arithmetic.jsonl and code.jsonl

- ``arithmetic.jsonl``: multi-step word problems (an amount, then two changes to it) whose
  three facts can be dealt to different agents; the answer is a whole number.
- ``code.jsonl``: small Python functions to write, each with a natural-language spec, a
  signature, example calls, unit tests (asserts) and a reference solution.

``tests/marl/tasks/test_dataset.py`` checks that this script reproduces the committed files
byte for byte, and that every reference answer and solution scores 1 with its verifier.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jo", "Kai", "Lena",
         "Milo", "Nia", "Omar", "Pia", "Quinn", "Rosa", "Sam", "Tove"]
THINGS = ["apples", "marbles", "stickers", "books", "coins", "shells", "pencils", "stamps",
          "cards", "beads"]


def change(rng: random.Random, name: str, thing: str, amount: int) -> tuple[str, int]:
    """One step of a problem: a sentence and the amount after it."""
    kind = rng.choice(["gain", "lose", "packs", "share"] if amount >= 4 else ["gain", "packs"])
    if kind == "gain":
        k = rng.randint(2, 30)
        return f"Then {name} is given {k} more {thing}.", amount + k
    if kind == "lose":
        k = rng.randint(1, amount - 1)
        return f"Then {name} gives away {k} {thing}.", amount - k
    if kind == "packs":
        packs, size = rng.randint(2, 5), rng.randint(2, 9)
        return f"Then {name} buys {packs} packs of {size} {thing} each.", amount + packs * size
    parts = rng.choice([d for d in (2, 3, 4) if amount // d >= 1])
    return (f"Then {name} splits the {thing} into {parts} equal piles and keeps one pile "
            f"(dropping any left over).", amount // parts)


def arithmetic(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        name, thing = rng.choice(NAMES), rng.choice(THINGS)
        amount = rng.randint(3, 40)
        fact_1 = f"{name} has {amount} {thing}."
        fact_2, amount = change(rng, name, thing, amount)
        fact_3, amount = change(rng, name, thing, amount)
        rows.append({"id": f"arith-{i:03d}", "fact_1": fact_1, "fact_2": fact_2,
                     "fact_3": fact_3, "question": f"How many {thing} does {name} have now?",
                     "answer": amount})
    return rows


#: Function families: (name, spec, signature, body, example arguments), with a parameter.
CODE = [
    ("add_{k}", "Return x plus {k}.", "def add_{k}(x):", "    return x + {k}",
     ["0", "5", "-{k}"]),
    ("times_{k}", "Return x multiplied by {k}.", "def times_{k}(x):", "    return x * {k}",
     ["0", "3", "-2"]),
    ("count_{c}", "Return how many times the letter '{c}' occurs in the string s.",
     "def count_{c}(s):", "    return s.count('{c}')", ["''", "'{c}{c}x{c}'", "'xyz'"]),
    ("drop_{c}", "Return the string s with every letter '{c}' removed.", "def drop_{c}(s):",
     "    return s.replace('{c}', '')", ["''", "'{c}a{c}b'", "'abc'"]),
    ("first_{k}", "Return the first {k} items of the list xs (all of them if it is shorter).",
     "def first_{k}(xs):", "    return xs[:{k}]", ["[]", "[1, 2, 3, 4, 5, 6]", "[9]"]),
    ("sum_above_{k}", "Return the sum of the numbers in xs that are greater than {k}.",
     "def sum_above_{k}(xs):", "    return sum(x for x in xs if x > {k})",
     ["[]", "[{k}, {k} + 1, 10, -3]", "[1, 2]"]),
    ("repeat_{k}", "Return the string s repeated {k} times.", "def repeat_{k}(s):",
     "    return s * {k}", ["''", "'ab'", "'x'"]),
    ("clamp_{k}", "Return x limited to the range from -{k} to {k}.", "def clamp_{k}(x):",
     "    return max(-{k}, min({k}, x))", ["0", "{k} + 7", "-{k} - 1"]),
]


def code(seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for family in CODE:
        for value in rng.sample(range(2, 10), 5):
            letter = "abcdefghijklmnopqrstuvwxyz"[value]
            fill = {"k": value, "c": letter}
            name, spec, signature, body, examples = (
                part.format(**fill) if isinstance(part, str) else [e.format(**fill)
                                                                   for e in part]
                for part in family)
            solution = f"{signature}\n{body}\n"
            scope: dict = {}
            exec(solution, scope)  # the reference solution gives the expected values
            calls = [f"{name}({arg})" for arg in examples]
            tests = "\n".join(f"assert {call} == {eval(call, scope)!r}" for call in calls)
            rows.append({"id": f"code-{len(rows):03d}", "name": name, "spec": spec,
                         "signature": signature, "examples": f"{calls[1]} returns "
                         f"{eval(calls[1], scope)!r}", "tests": tests, "answer": solution})
    rng.shuffle(rows)
    return rows


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def main() -> None:
    write(HERE / "arithmetic.jsonl", arithmetic(240, seed=0))
    write(HERE / "code.jsonl", code(seed=0))
    print(f"wrote {HERE / 'arithmetic.jsonl'} and {HERE / 'code.jsonl'}")


if __name__ == "__main__":
    main()
