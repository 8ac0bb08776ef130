"""The training loop: learning on a toy problem, parameter updates, resume, NaN guard,
config errors, and the CLI entry point."""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import marl.algorithms.common as common
from marl.algorithms.config import TrainConfig, load_config
from marl.cli import app
from marl.errors import ConfigError, MarlError
from marl.tasks import TASKS
from marl.tasks.base import Instance, Task, TaskParams
from marl.team import load_team
from marl.trainer import Trainer
from tests.marl.conftest import ROOT, kill_and_resume


class SayDigit(Task):
    """Toy task with a known answer: the team must answer a message starting with '7'."""

    id = "say_digit_v0"
    Params = TaskParams

    def required_sources(self):
        return set()

    def sample(self, rng: np.random.Generator) -> Instance:
        return Instance({a: "say it" for a in self.agents}, "7")

    def message_length(self, agent):
        return 1

    answer_length = 1

    def oracle(self, agent, observation, final):
        return "7"

    def random_message(self, agent, final, rng):
        return str(int(rng.integers(10)))

    def score(self, instance, answer):
        return float(answer.startswith("7"))


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(TASKS, "say_digit_v0", f"{__name__}:SayDigit")
    return load_team({"name": "toy", "task": {"name": "say_digit_v0"},
                      "agents": [{"id": "a"}],
                      "policies": {"default": {"backend": "tiny", "max_new_tokens": 2}},
                      "topology": {"kind": "chain"}, "protocol": {"answer": "a"}})


def small(**kw) -> TrainConfig:
    base = dict(episodes_per_iter=4, group_size=8, eval_every=2, eval_episodes=8,
                checkpoint_every=2, sft_coef=0.0, transcripts_per_iter=1, epochs=1,
                minibatches=1)
    return TrainConfig(**{**base, **kw})


def test_rl_learns_a_known_answer(toy, tmp_path):
    trainer = Trainer(toy, small(iterations=25, lr=1e-2, eval_every=25), tmp_path)
    trainer.train()
    rates = [r["success_rate"] for r in trainer.rows]
    assert np.mean(rates[:3]) < 0.1
    assert np.mean(rates[-3:]) > np.mean(rates[:3]) + 0.3


def test_parameters_change_after_a_step(toy, tmp_path):
    trainer = Trainer(toy, small(iterations=1, sft_coef=1.0), tmp_path)
    before = [p.detach().clone() for p in trainer.learner.trainables[0].policy.parameters()]
    trainer.step()
    after = trainer.learner.trainables[0].policy.parameters()
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_kill_and_resume_equals_an_uninterrupted_run(toy, tmp_path):
    cfg = small(iterations=6, sft_coef=0.5, demo_episodes=2)
    full, again = kill_and_resume(toy, cfg, tmp_path, kill_at=4, resume_from=4)
    assert again == full and len(full) == 6


def test_existing_run_needs_resume(toy, tmp_path):
    Trainer(toy, small(iterations=2), tmp_path).train()
    with pytest.raises(MarlError, match="--resume"):
        Trainer(toy, small(iterations=2), tmp_path)
    with pytest.raises(MarlError, match="no checkpoint"):
        Trainer(toy, small(iterations=2), tmp_path / "empty", resume=True)


def test_nan_losses_are_skipped_counted_and_then_stop_the_run(toy, tmp_path, monkeypatch):
    trainer = Trainer(toy, small(iterations=10, max_bad_iterations=3), tmp_path)
    trainer.step()
    trainer.step()  # a good checkpoint at iteration 2
    good = [p.detach().clone() for p in trainer.learner.trainables[0].policy.parameters()]
    real = common.pg_terms

    def poisoned(*args, **kwargs):
        loss, stats = real(*args, **kwargs)
        return loss * float("nan"), stats

    monkeypatch.setattr(common, "pg_terms", poisoned)
    row = trainer.step()
    assert row["skipped_updates"] == 1  # counted in the metrics
    for p, q in zip(trainer.learner.trainables[0].policy.parameters(), good, strict=True):
        assert torch.equal(p, q)  # the poisoned update was not applied
    trainer.step()
    with pytest.raises(MarlError, match="diverged.*lower lr"):
        trainer.step()
    restored = Trainer(toy, small(iterations=10), tmp_path, resume=True)
    assert restored.iteration == 4 or restored.iteration == 2
    for p in restored.learner.trainables[0].policy.parameters():
        assert torch.isfinite(p).all()


@pytest.mark.parametrize(("sets", "field", "message"), [
    (["lrr=0.1"], "lrr", "Did you mean 'lr'?"),
    (["lr=fast"], "lr", "fast"),
    (["lr=-1"], "lr", "greater than 0"),
    (["algorithm=dqn"], "algorithm", "magrpo"),
    (["group_size=1"], "group_size", "at least 2"),
    (["iterations"], "iterations", "key=value"),
])
def test_config_errors_name_the_field(sets, field, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, sets)
    assert field in str(err.value) and message in str(err.value)


def test_config_file_errors_name_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("algorithm: grpo\nclip_hihg: 0.3\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"{path}:2: clip_hihg" in str(err.value) and "clip_high" in str(err.value)


@pytest.mark.parametrize("name", ["magrpo", "grpo", "ppo"])
def test_shipped_algorithm_configs_load(name):
    cfg = load_config(ROOT / "configs" / "algorithm" / f"{name}.yaml")
    assert cfg.algorithm == name


def test_cli_train_smoke(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, [
        "train", str(ROOT / "scenarios" / "signal.yaml"), "--out", str(out),
        "--set", "iterations=2", "--set", "episodes_per_iter=2", "--set", "group_size=2",
        "--set", "eval_episodes=4", "--set", "eval_every=1", "--set", "demo_episodes=2"])
    assert res.exit_code == 0, res.output
    assert "2 oracle-played instances as demonstrations" in res.output
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    keys = {"iteration", "episodes", "reward_mean", "success_rate", "tokens_per_episode",
            "cost_per_episode", "tokens_per_agent", "loss", "entropy", "kl", "grad_norm",
            "samples_per_s", "wall_s", "eval_success_rate", "eval_reward_mean"}
    assert len(rows) == 2 and keys <= set(rows[-1])
    assert set(rows[0]["tokens_per_agent"]) == {"speaker", "listener"}
    assert (out / "config.yaml").is_file() and (out / "summary.json").is_file()
    ckpt = out / "checkpoints" / "best"
    assert (ckpt / "speaker" / "model.safetensors").is_file()
    res = CliRunner().invoke(app, ["run", str(ROOT / "scenarios" / "signal.yaml"),
                                   "--checkpoint", str(ckpt), "--episodes", "4",
                                   "--out", str(tmp_path / "eval")])
    assert res.exit_code == 0, res.output


def test_cli_train_config_error_has_no_traceback(tmp_path):
    res = CliRunner().invoke(app, ["train", str(ROOT / "scenarios" / "signal.yaml"),
                                   "--set", "epochz=2", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "epochz" in res.output and "Traceback" not in res.output
