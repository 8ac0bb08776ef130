"""The README's promises: two set-up commands, CI runs the test one, the main job exists."""

import re
import shlex

from tests.marl.conftest import ROOT

README = (ROOT / "README.md").read_text()


def setup_commands() -> list[str]:
    section = README.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, flags=re.S)


def test_exactly_two_setup_commands():
    assert len(setup_commands()) == 2


def test_ci_runs_the_readme_test_command():
    test_command = setup_commands()[1]
    assert "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_main_job_names_a_shipped_scenario():
    words = shlex.split(setup_commands()[0].split("&&")[-1])
    assert words[0] == "marl" and words[1] in ("run", "train") and (ROOT / words[2]).is_file()
