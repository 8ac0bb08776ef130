"""llm-marl: multi-agent reinforcement learning for teams of LLM agents.

>>> env = make_env("scenarios/signal.yaml", seed=0)
>>> obs, infos = env.reset()
>>> env.scheduled
('speaker',)
"""

from marl.env import TeamEnv, make_env
from marl.errors import MarlError, ScenarioError
from marl.team import Team, load_team

__version__ = "0.1.0"
__all__ = ["MarlError", "ScenarioError", "Team", "TeamEnv", "load_team", "make_env"]
