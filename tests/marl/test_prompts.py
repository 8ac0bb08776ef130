"""The prompt format, written and read in one place (marl.prompts): the transcript an agent
reads, and the same prompt as a chat."""

from marl.prompts import conversation, header, message_line, query, turn_open


def transcript() -> str:
    """b's prompt in round 3 of a team where a talks to b: b's private text spans two
    lines, a's second message too, and b said nothing it could hear back in round 2."""
    text = header("b", "solver", "fact 1\nfact 2", "Answer with a number.")
    text += turn_open(0) + message_line("a", "hello") + query("b", False) + "ok"
    text += turn_open(1) + query("b", False) + "still here"
    text += turn_open(2) + message_line("a", "it is\nlead> 42") + query("b", True)
    return text


def test_a_transcript_reads_as_system_user_and_assistant_turns():
    chat = conversation(transcript())
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user", "assistant",
                                         "user"]
    assert chat[0]["content"] == "you are b (solver). fact 1\nfact 2\nAnswer with a number."
    assert chat[1]["content"] == "[round 1]\na: hello\nYour message:"
    assert chat[2]["content"] == "ok" and chat[4]["content"] == "still here"
    assert chat[3]["content"] == "[round 2]\nYour message:"
    # a message's own lines stay inside its turn: "lead> 42" is a's text, not lead's line
    assert chat[5]["content"] == "[round 3]\na: it is\nlead> 42\nYour answer:"


def test_the_first_call_is_a_system_and_a_user_turn():
    text = header("a", "speaker", "x", "") + turn_open(0) + query("a", False)
    assert conversation(text) == [{"role": "system", "content": "you are a (speaker). x"},
                                  {"role": "user", "content": "[round 1]\nYour message:"}]
