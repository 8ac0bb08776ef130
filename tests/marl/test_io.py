"""The JSON-lines reader: a cut-off last line is dropped with a note; a damaged middle line
is an error, or with ``repair`` dropped, keeping only a whole row glued onto its end."""

import pytest

from marl.errors import MarlError
from marl.io import read_jsonl

ROW = '{"step": 1, "stats": {"a": 1}}\n'


def test_a_cut_off_last_line_is_dropped_with_a_note(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(ROW + '{"step": 2, "stats": {"a": 1}\n')  # ends in a whole nested map
    notes = []
    assert read_jsonl(path, notes.append) == [{"step": 1, "stats": {"a": 1}}]
    assert notes == [f"{path}:2: dropped a cut-off last line"]


def test_a_damaged_middle_line_is_an_error_unless_repaired(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(ROW + '{"step": 2, "st{"step": 3, "stats": {"a": 1}}\n{"step": 4}\n')
    with pytest.raises(MarlError, match=r"m.jsonl:2 is not valid JSON.*--resume"):
        read_jsonl(path)
    notes = []
    steps = [r["step"] for r in read_jsonl(path, notes.append, repair=True)]
    assert steps == [1, 3, 4]
    assert notes == [f"{path}:2: dropped a damaged line (kept the whole row after it)"]
