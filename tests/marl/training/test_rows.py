"""What the evaluation rows say about how far each agent's output depends on its input."""

from marl.policies import Completion
from marl.policies.scripted import RandomPolicy, ScriptedPolicy
from marl.rollout import collect
from marl.team import load_team
from marl.training.rows import input_information
from tests.marl.conftest import ROOT


class Same(RandomPolicy):
    """Says one fixed letter whatever it read."""

    def generate(self, requests, greedy=False):
        return [Completion("q") for _ in requests]


def test_input_information_is_zero_for_an_agent_that_says_the_same_whatever_it_read():
    """The scripted speaker names each of the four objects by its own letter (2 bits, the
    entropy of the objects); one that always says "q" carries nothing; agents whose input
    never varies are left out."""
    team = load_team(ROOT / "scenarios" / "signal.yaml")
    scripted = ScriptedPolicy(team.task)
    batch = collect(team, dict.fromkeys(team.ids, scripted), 256, 1, seed=0, greedy=True)
    told = input_information(batch)
    assert abs(told["speaker"] - 2.0) < 0.05 and abs(told["listener"] - 2.0) < 0.05
    deaf = collect(team, {"speaker": Same(team.task, 0), "listener": scripted}, 256, 1,
                   seed=0, greedy=True)
    assert {r["transcript"][0]["message"] for r in deaf.records} == {"q"}
    told = input_information(deaf)
    assert told["speaker"] == 0.0  # its object varies, its message does not
    assert "listener" not in told  # it always hears "q"
