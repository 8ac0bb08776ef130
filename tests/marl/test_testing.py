"""``marl.testing``'s checks raise :class:`ContractError` explicitly, so they check the
contract under ``python -O`` too (where a bare ``assert`` is skipped)."""

import subprocess
import sys

from tests.marl.conftest import ROOT

BROKEN = """
import marl.testing as t
from marl.team import load_team
episodes = iter([["one"], ["another"]])
t.trace = lambda env, n, seed: next(episodes)  # an env whose episodes differ by run
try:
    t.check_determinism(load_team("scenarios/signal.yaml"))
except t.ContractError as exc:
    print("refused:", exc)
"""


def test_a_failed_check_raises_under_python_dash_o():
    out = subprocess.run([sys.executable, "-O", "-c", BROKEN], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "refused: the same seed gave different episodes"
