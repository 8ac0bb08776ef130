"""Population-based training: config validation, the search space, and small populations
on a local Ray (exploits happen, outputs are complete, the best member plays)."""

import json
import os
import signal
import threading
import time

import pytest
import yaml
from typer.testing import CliRunner

from marl.analysis.analyze import analyze
from marl.cli import app
from marl.errors import ConfigError, MarlError
from marl.team import load_team
from populations.config import PBTConfig, Range, load_league_config, load_pbt_config
from populations.pbt import _check_mutations, run_pbt, search_space
from tests.marl.conftest import ROOT

SMALL = {"members": 2, "budget_steps": 12, "perturbation_interval": 2, "quantile_fraction": 0.5,
         "train": {"warmup_steps": 2, "warmup_episodes": 4, "episodes_per_iter": 2,
                   "group_size": 2, "eval_episodes": 4, "eval_every": 100,
                   "checkpoint_every": 1000, "transcripts_per_iter": 0}}


@pytest.mark.parametrize(("data", "names"), [
    ({"memberz": 4}, ["memberz", "members"]),
    ({"mutations": {"gamma": [0.9, 1.0]}}, ["gamma", "lr", "topology"]),
    ({"mutations": {"topology": ["star", "chain"]}}, ["mutations.topology", "kind"]),
    ({"mutations": {"lr": [0.001]}}, ["mutations.lr", "two values"]),
    ({"mutations": {"lr": {"min": 1e-2, "max": 1e-3}}}, ["min", "below max"]),
    ({"objective": "success_at_cost"}, ["cost_cap_usd"]),
    ({"train": {"lr": -1}}, ["train.lr", "greater than 0"]),
    ({"train": {"seed": 3}}, ["train", "seed", "seed + k"]),
    ({"budget_steps": 400}, ["budget_steps=400", "600 warm-up steps", "train.warmup_steps"]),
])
def test_bad_population_configs_name_the_key(tmp_path, data, names):
    path = tmp_path / "pbt.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_pbt_config(path)
    assert all(n in str(info.value) for n in names), str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "population").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_shipped_population_configs_load(path):
    if path.name.startswith("league"):
        assert load_league_config(path).train_config().iterations > 0
        return
    cfg = load_pbt_config(path)
    assert cfg.member_config(2).seed == cfg.seed + 2
    assert cfg.member_config(0).iterations == cfg.budget_steps - cfg.member_config(0).warmup
    # The scenario the file's first line names accepts every topology it searches.
    scenario = path.read_text().splitlines()[0].split()[4]
    _check_mutations(load_team(ROOT / scenario), cfg)


def test_the_search_space_samples_ranges_and_shifts_lists():
    cfg = PBTConfig(mutations={"lr": Range(min=1e-4, max=1e-2, log=True),
                               "entropy_coef": [0.0, 0.05],
                               "topology": [{"kind": "star", "hub": "lead"},
                                            {"kind": "chain"}, {"kind": "chain", "order": []}]})
    initial, mutations = search_space(cfg)
    assert mutations["entropy_coef"] == [0.0, 0.05]
    assert mutations["topology"] == ["star", "chain_1", "chain_2"]
    assert initial["topology"].categories == ["star", "chain_1", "chain_2"]
    assert (initial["lr"].lower, initial["lr"].upper) == (1e-4, 1e-2)
    assert mutations["lr"] is initial["lr"]


def pbt_config(**kw) -> PBTConfig:
    return PBTConfig.model_validate({**SMALL, **kw})


def test_a_population_exploits_and_writes_every_output(ray_local, tmp_path):
    topologies = [{"kind": "star", "hub": "lead"},
                  {"kind": "chain", "order": ["w1", "w2", "w3", "lead"]}]
    # Reward net of a token penalty that differs by member and topology: no two members
    # tie, so the worse one is always cloned (members tied with the top never are).
    cfg = pbt_config(objective="net_reward",
                     mutations={"lr": {"min": 1e-4, "max": 1e-2, "log": True},
                                "penalty_per_1k": [0.5, 1.0, 2.0], "topology": topologies})
    scenario = ROOT / "scenarios" / "gather_star.yaml"
    population = run_pbt(scenario, cfg, tmp_path / "pop", log=lambda m: None)
    saved = json.loads((tmp_path / "pop" / "population.json").read_text())
    assert saved["finished"] and saved["members"] == population["members"]
    assert [m["steps"] for m in saved["members"]] == [12, 12]
    for m in saved["members"]:
        assert {h["settings"]["topology"] for h in m["history"]} <= {"star", "chain"}
        rows = (tmp_path / "pop" / "members" / m["id"] / "metrics.jsonl").read_text()
        assert len(rows.splitlines()) >= 12
    exploits = [json.loads(x) for x in
                (tmp_path / "pop" / "exploits.jsonl").read_text().splitlines()]
    assert exploits and saved["exploits"] == len(exploits)
    ids = {m["id"] for m in saved["members"]}
    assert all(e["donor"] in ids and e["target"] in ids and e["donor"] != e["target"]
               for e in exploits)
    result = CliRunner().invoke(app, ["run", str(scenario), "--checkpoint",
                                      saved["best"]["checkpoint"], "--episodes", "2",
                                      "--out", str(tmp_path / "play")])
    assert result.exit_code == 0, result.output
    # marl analyze reads the members with their last settings, each on its own graph.
    found = analyze([tmp_path / "pop"])["runs"]
    assert {r["label"] for r in found} == {f"pop/{i}" for i in ids}
    for r in found:
        assert r["values"]["topology"] in ("star", "chain") and r["edges"]
        assert r["curve"]["iteration"] and r["scenario"] == "gather_star"
    # A finished population resumes to the same outcome; a new one refuses its directory.
    again = run_pbt(scenario, cfg, tmp_path / "pop", resume=True, log=lambda m: None)
    assert [m["steps"] for m in again["members"]] == [12, 12]
    with pytest.raises(MarlError, match="--resume"):
        run_pbt(scenario, cfg, tmp_path / "pop", log=lambda m: None)


def test_resume_without_a_population_says_so(tmp_path):
    with pytest.raises(MarlError, match="holds no population"):
        run_pbt(ROOT / "scenarios" / "signal.yaml", pbt_config(), tmp_path / "none",
                resume=True)


def test_a_topology_that_does_not_fit_is_refused_before_ray_starts(tmp_path):
    cfg = pbt_config(mutations={"topology": [{"kind": "star", "hub": "lead"},
                                             {"kind": "star", "hub": "nobody"}]})
    with pytest.raises(MarlError, match="nobody"):
        run_pbt(ROOT / "scenarios" / "gather_star.yaml", cfg, tmp_path / "pop")


def test_the_cli_runs_a_population_and_prints_the_members(ray_local, tmp_path):
    config = tmp_path / "pbt.yaml"
    config.write_text(yaml.safe_dump({**SMALL, "budget_steps": 4,
                                      "mutations": {"temperature": [0.8, 1.0]}}))
    result = CliRunner().invoke(app, ["population", "pbt", str(ROOT / "scenarios" / "signal.yaml"),
                                      "--config", str(config), "--out", str(tmp_path / "pop")])
    assert result.exit_code == 0, result.output
    assert "2 members x 4 steps" in result.output and "best member" in result.output
    assert (tmp_path / "pop" / "best" / "speaker").is_dir()


def test_the_cli_names_a_bad_population_config_without_a_traceback(tmp_path):
    config = tmp_path / "pbt.yaml"
    config.write_text("members: 1\n")
    result = CliRunner().invoke(app, ["population", "pbt", str(ROOT / "scenarios" / "signal.yaml"),
                                      "--config", str(config)])
    assert result.exit_code == 2 and "members" in result.output
    assert "Traceback" not in result.output


def test_a_killed_member_is_restarted_from_its_checkpoint(ray_local, tmp_path):
    """SIGKILL one member's process mid-run: Tune restarts it from its last checkpoint
    (max_failures) and the population completes."""
    out = tmp_path / "pop"
    killed: list = []

    def killer() -> None:
        deadline = time.monotonic() + 120
        while not killed and time.monotonic() < deadline:
            for lineage in out.glob("members/*/lineage.jsonl"):
                rows = [json.loads(x) for x in lineage.read_text().splitlines()]
                metrics = lineage.parent / "metrics.jsonl"
                steps = len(metrics.read_text().splitlines()) if metrics.exists() else 0
                if steps >= 5:  # past the report (and checkpoint) at step 4
                    os.kill(rows[-1]["pid"], signal.SIGKILL)
                    killed.append((lineage, len(rows), rows[-1]["pid"]))
                    return
            time.sleep(0.05)

    thread = threading.Thread(target=killer)
    thread.start()
    cfg = pbt_config(budget_steps=16, perturbation_interval=4,
                     mutations={"temperature": [0.9, 1.0]})
    population = run_pbt(ROOT / "scenarios" / "signal.yaml", cfg, out, log=lambda m: None)
    thread.join()
    assert killed
    assert [m["steps"] for m in population["members"]] == [16, 16]
    lineage, seen, pid = killed[0]
    later = [json.loads(x) for x in lineage.read_text().splitlines()][seen:]
    # The member started again in another process, from a checkpoint (its own or, if PBT
    # exploited it meanwhile, a donor's), not from scratch.
    assert later and later[0]["pid"] != pid and later[0]["step"] >= 4


class FakeTrial:
    def is_finished(self):
        return False


def test_members_tied_with_the_top_are_not_cloned():
    from types import SimpleNamespace

    from populations.pbt import TiesKeptPBT

    scheduler = TiesKeptPBT(time_attr="step", perturbation_interval=1, metric="objective",
                            mode="max", hyperparam_mutations={"lr": [1e-3, 1e-2]},
                            quantile_fraction=0.5)
    trials = [FakeTrial() for _ in range(4)]
    for t, score in zip(trials, [1.0, 1.0, 1.0, 0.5], strict=True):
        scheduler._trial_state[t] = SimpleNamespace(last_score=score)
    lower, upper = scheduler._quantiles()
    assert lower == [trials[3]] and len(upper) == 2  # only the member below the top
    for t in trials:
        scheduler._trial_state[t].last_score = 1.0
    assert scheduler._quantiles()[0] == []  # all tied: nobody is cloned


def test_a_member_can_own_a_placement_group(ray_local, tmp_path):
    """resources.bundles: each member is a placement group (trainer + room for a rollout
    engine); the member runs inside it."""
    bundles = [{"CPU": 1.0}, {"CPU": 0.5}]
    cfg = pbt_config(budget_steps=4, mutations={"temperature": [0.9, 1.0]},
                     resources={"bundles": bundles})
    run_pbt(ROOT / "scenarios" / "signal.yaml", cfg, tmp_path / "pop", log=lambda m: None)
    summaries = [json.loads(p.read_text())
                 for p in sorted((tmp_path / "pop").glob("members/*/summary.json"))]
    assert len(summaries) == 2
    assert all(s["placement_group"] == bundles for s in summaries)


def test_placement_bundles_must_not_be_empty():
    with pytest.raises(ValueError, match="at least one bundle"):
        PBTConfig.model_validate({"resources": {"bundles": []}})
