"""Free-form messages in ``marl analyze``: the metrics, and a hand-made text run read whole."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from marl.analysis.analyze import analyze
from marl.analysis.freeform import empty_or_cut_share, message_lengths, vocabulary_entropy
from marl.analysis.report import figures, html_report, text_summary
from marl.tasks import Instance, Task, TaskParams
from tests.marl.conftest import ROOT


class ChatParams(TaskParams):
    pass


class Chat(Task):
    """A free-form task for these tests: the speaker describes, the listener answers."""

    id = "chat_v0"
    Params = ChatParams
    messages = "text"

    def sample(self, rng: np.random.Generator) -> Instance:
        return Instance(private={"speaker": "a red cube", "listener": ""}, answer="left")


SCENARIO = f"""name: chat
task: {{name: "{__name__}:Chat"}}
agents:
  - {{id: speaker, role: speaker, policy: speaker, prompt: Describe the object.}}
  - {{id: listener, role: listener, policy: listener, prompt: Say where it is.}}
policies:
  speaker: {{backend: tiny, max_new_tokens: 8}}
  listener: {{backend: tiny, max_new_tokens: 8}}
topology: {{kind: chain}}
protocol: {{rounds: 1, answer: listener}}
"""

# The speaker's messages at the last evaluation: (text, flags, finish, completion tokens).
LAST = [("The red cube\nis on the left.", {}, "eos", 9),
        ("Зелёный шар 🟢", {}, "eos", 7),
        ("", {"empty": True}, "eos", 0),
        ("ЗЕЛЁНЫЙ cube is", {"truncated_from": 12}, "length", 8)]


def test_message_lengths_count_code_points_and_whitespace_words():
    assert message_lengths(["a\nb  c", "é"]) == {"mean_chars": 3.5, "max_chars": 6,
                                                 "mean_words": 2.0}
    assert message_lengths([""]) == {"mean_chars": 0.0, "max_chars": 0, "mean_words": 0.0}
    with pytest.raises(ValueError, match="no messages"):
        message_lengths([])


def test_vocabulary_entropy_pools_lower_cased_words():
    assert vocabulary_entropy(["A b", "a B"]) == 1.0  # a, b: 1/2 each
    assert vocabulary_entropy(["same words", "same words"]) == 1.0
    assert vocabulary_entropy(["one"]) == 0.0
    assert vocabulary_entropy([]) == vocabulary_entropy(["", "\n\t"]) == 0.0


def test_empty_or_cut_share_reads_flags_and_finish():
    entries = [{"message": "", "flags": {"empty": True}, "finish": "length"},  # both
               {"message": "", "flags": {}},  # no text, though not flagged
               {"message": "ok", "finish": "stop"}]  # a record without flags
    assert empty_or_cut_share(entries) == {"empty_share": pytest.approx(2 / 3),
                                           "cut_share": pytest.approx(1 / 3)}
    with pytest.raises(ValueError, match="no entries"):
        empty_or_cut_share([])


def _episode(speaker: tuple, failed: bool = False) -> dict:
    text, flags, finish, tokens = speaker
    said = [{"round": 0, "layer": 0, "agent": "speaker", "message": text, "flags": flags,
             "valid": bool(text.strip()), "oracle_agrees": False, "finish": finish},
            {"round": 0, "layer": 1, "agent": "listener", "message": "left, I think",
             "flags": {}, "valid": True, "oracle_agrees": False, "finish": "eos"}]
    ledger = [{"episode": 0, "round": 0, "layer": j, "agent": a, "model": "gpt-4o-mini",
               "prompt_tokens": 20, "cached_tokens": 0, "completion_tokens": n,
               "received": {"speaker": tokens} if a == "listener" else {}, "cost_usd": "0.001"}
              for j, (a, n) in enumerate((("speaker", tokens), ("listener", 4)))]
    if failed:  # the speaker's call failed: it said nothing, billed nothing
        said = [{**m, "message": "", "flags": {"error": "timeout"}, "finish": None}
                for m in said]
        ledger = []
    return {"success": False, "split": "train", "private": {"speaker": "a red cube"},
            "transcript": said, "ledger": ledger}


def _text_run(path: Path) -> Path:
    """A training run of the Chat task with evaluations at iterations 1 and 2."""
    (path / "episodes").mkdir(parents=True)
    (path / "scenario.yaml").write_text(SCENARIO)
    rows = [{"phase": "rl", "iteration": i, "episodes": 4 * i, "success_rate": 0.5,
             "reward_mean": 0.5, "tokens_per_episode": 40.0, "cost_per_episode": 0.002,
             "eval_success_rate": 0.5} for i in (1, 2)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    first = [_episode(("hello", {}, "eos", 2)), _episode(("Hello", {}, "eos", 2))]
    last = [*map(_episode, LAST), _episode(LAST[0], failed=True)]
    for i, records in ((1, first), (2, last)):
        (path / "episodes" / f"eval_{i:06d}.jsonl").write_text("".join(
            json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    (path / "summary.json").write_text(json.dumps({"scenario": "chat", "iterations": 2}))
    return path


def test_a_free_form_run_is_measured_per_sender_over_training(tmp_path):
    data = analyze([_text_run(tmp_path / "chat")])
    (run,) = data["runs"]
    assert run["messages"]["format"] == "text"
    assert list(run["messages"]["agents"]) == ["speaker"]  # the listener only answers
    s = run["messages"]["agents"]["speaker"]
    assert s["iteration"] == [1, 2]
    assert s["mean_chars"][0] == 5.0 and s["vocabulary_entropy"][0] == 0.0  # hello, Hello
    # The failed call is left out; 28 + 13 + 0 + 15 characters over 4 messages.
    assert s["mean_chars"][1] == 14.0 and s["max_chars"][1] == 28
    assert s["mean_words"][1] == (7 + 3 + 0 + 3) / 4
    assert s["tokens_per_message"] == [2.0, (9 + 7 + 0 + 8) / 4]
    # the, cube, is, зелёный (ЗЕЛЁНЫЙ lower-cased) twice; red, on, "left.", шар, 🟢 once
    counts = [2, 2, 2, 2, 1, 1, 1, 1, 1]
    h = -sum(c / 13 * math.log2(c / 13) for c in counts)
    assert s["vocabulary_entropy"][1] == pytest.approx(h)
    assert s["empty_share"] == [0.0, 0.25] and s["cut_share"] == [0.0, 0.25]
    page = html_report(data, figures(data))
    assert "<figure id='messages-00'>" in page and "chat: messages over training." in page
    assert "<h2>Messages (last evaluation)</h2>" in page
    assert "chat | speaker | 2 | 14.000 | 28 | 3.250 | 6.000 |" in text_summary(data)


def test_symbol_code_runs_are_measured_but_drawn_as_before(tmp_path):
    run = _text_run(tmp_path / "codes")
    shutil.copy(ROOT / "scenarios" / "signal.yaml", run / "scenario.yaml")
    data = analyze([run])
    assert data["runs"][0]["messages"]["format"] == "codes"
    assert data["runs"][0]["messages"]["agents"]["speaker"]["iteration"] == [1, 2]
    assert not [name for name, _, _ in figures(data) if name.startswith("messages")]
    assert "Messages (last evaluation)" not in html_report(data, [])
