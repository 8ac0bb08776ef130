from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


@pytest.fixture
def scenario_dir() -> Path:
    return ROOT / "scenarios"
