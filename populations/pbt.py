"""Population-based training of a scenario's team on Ray Tune (Jaderberg et al. 2017).

Each member is a Tune trial running :class:`marl.training.trainer.Trainer` with its own seed. Every
``perturbation_interval`` trainer steps it evaluates, reports its objective with a
checkpoint, and Tune's ``PopulationBasedTraining`` may replace it by a clone of a better
member (exploit) with perturbed settings (explore); the clone restores the donor's
checkpoint and then re-reads every mutable setting from its own config. The budget is the
trainer's own step counter (kept in the checkpoint), since a clone's Tune iteration
rewinds to its donor's.

Output directory::

    population.json   every member: settings over time, final and best metrics, cost
    exploits.jsonl    every clone: step, target, donor, settings before -> after
    members/<id>/     each member's run directory (metrics.jsonl, episodes/; reports.jsonl:
                      every report; lineage.jsonl: every start or restart, its step,
                      donor, process id)
    best/             the best member's last checkpoint (marl run --checkpoint best)
    tune/             Tune's experiment (what --resume restores)

Where this departs from the paper: members report at fixed step intervals rather than
asynchronously by wall time, not during the format warm-up, and exploits follow Tune's
quantile rule.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import yaml
from ray import tune
from ray.tune.schedulers import PopulationBasedTraining
from ray.tune.search.basic_variant import BasicVariantGenerator

from marl.cluster import ray_session, task_modules
from marl.errors import MarlError
from marl.io import append_jsonl, atomic_write_json, atomic_write_text, read_jsonl
from marl.team import Team, load_team
from marl.training.curriculum import variant
from marl.training.trainer import Trainer
from populations.config import PBTConfig, Range, objective

#: Reported with every result: what a member is and did (besides its settings).
REPORTED = ("step", "objective", "eval_success_rate", "eval_reward_mean", "success_rate",
            "cost_per_episode", "tokens_per_episode", "cost_usd", "tokens", "donor",
            "donor_step")


@dataclass(frozen=True)
class MemberSpec:
    """What every member needs besides its (mutable) Tune config."""

    scenario: str
    pbt: PBTConfig
    out: str


def member_index(trial_id: str) -> int:
    """The member's number in the population: Tune's trial ids end in ``_NNNNN``.

    >>> member_index("3f2a1_00002")
    2
    """
    tail = trial_id.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else zlib.crc32(trial_id.encode()) % 10_000


def settings_of(config: dict[str, Any], cfg: PBTConfig) -> dict[str, Any]:
    """The trainer settings a Tune config stands for (topology labels resolved)."""
    out = {k: config[k] for k in cfg.mutations if k in config}
    if "topology" in out:
        out["topology"] = cfg.topology_labels()[out["topology"]]
    return out


def member(config: dict[str, Any], spec: MemberSpec) -> None:
    """One member of the population: a Tune function trainable."""
    trial_id = tune.get_context().get_trial_id()
    cfg = spec.pbt
    run_dir = Path(spec.out) / "members" / trial_id
    team = _placed(load_team(spec.scenario), cfg)
    trainer = Trainer(team, cfg.member_config(member_index(trial_id)), run_dir,
                      log=lambda msg: None, append=True)
    spent = {"cost_usd": 0.0, "tokens": 0.0}
    donor, donor_step = "", -1
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            trainer.restore(Path(d) / "trainer")
            saved = json.loads((Path(d) / "member.json").read_text())
        spent = saved["spent"]
        if saved["trial_id"] != trial_id:
            donor, donor_step = saved["trial_id"], trainer.step_count
    trainer.set(**settings_of(config, cfg))  # a clone's settings are its own, not its donor's
    settings = {k: config[k] for k in cfg.mutations}  # as Tune sees them (topology labels)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(
        {"scenario": spec.scenario, **trainer.cfg.model_dump()}, sort_keys=False))
    atomic_write_text(run_dir / "scenario.yaml", trainer.team.to_yaml())
    append_jsonl(run_dir / "lineage.jsonl", {"step": trainer.step_count, "donor": donor or None,
                                             "settings": settings, "pid": os.getpid()})
    latest: dict[str, Any] = {}

    def report() -> None:
        if latest.get("eval_step") != trainer.step_count:  # no evaluation at this step yet
            evaluated, _ = trainer.evaluate()
            latest.update(evaluated, eval_step=trainer.step_count)
        metrics = {**{k: v for k, v in latest.items() if not isinstance(v, dict)},
                   **spent, "step": trainer.step_count, "donor": donor,
                   "donor_step": donor_step, "objective": objective(latest, cfg),
                   **{f"setting/{k}": v for k, v in settings.items()}}
        # The member's own record: Tune's result files of a restored trial can lose rows.
        append_jsonl(run_dir / "reports.jsonl", {**metrics, "settings": settings})
        if trainer.step_count >= cfg.budget_steps:  # Tune stops the member at this report
            atomic_write_json(run_dir / "summary.json", {
                "member": trial_id, "steps": trainer.step_count, "final": metrics,
                "node": ray.get_runtime_context().get_node_id(), "gpu_ids": ray.get_gpu_ids(),
                "placement_group": _bundles(),
                "device": str(trainer.learner.trainables[0].policy.model.device)})
        with tempfile.TemporaryDirectory() as d:
            trainer.save(Path(d) / "trainer")
            atomic_write_json(Path(d) / "member.json", {"trial_id": trial_id, "spent": spent})
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))

    reported = False
    while trainer.step_count < cfg.budget_steps:
        row = trainer.step()
        episodes = trainer.cfg.episodes_per_iter * trainer.cfg.group_size
        if row["phase"] == "rl":
            spent["cost_usd"] += row["cost_per_episode"] * episodes
            spent["tokens"] += row["tokens_per_episode"] * episodes
        latest = {**latest, **{k: v for k, v in row.items()
                               if k in REPORTED or k.startswith("eval_")}}
        latest["step"] = trainer.step_count
        if "eval_success_rate" in row:
            latest["eval_step"] = trainer.step_count
        # No report (so no exploit) during the warm-up: its evaluations say nothing yet.
        if trainer.phase == "rl" and (trainer.step_count % cfg.perturbation_interval == 0
                                      or trainer.step_count >= cfg.budget_steps):
            report()
            reported, donor, donor_step = True, "", -1
    if not reported:  # cloned from a donor that had already spent the whole budget
        report()


def _bundles() -> list[dict[str, float]] | None:
    """The bundles of the placement group this member runs in (None outside one)."""
    group = ray.util.get_current_placement_group()
    return None if group is None else group.bundle_specs


def _placed(team: Team, cfg: PBTConfig) -> Team:
    """With GPUs per member, the model policies run on the GPU Ray assigned (Ray sets
    CUDA_VISIBLE_DEVICES, so it is ``cuda``). GPUs declared on a machine without CUDA (a
    simulated cluster) leave them on the CPU."""
    import torch

    if not cfg.resources.gpus or not torch.cuda.is_available():
        return team
    models = {name: {"device": "cuda"} for name, p in team.scenario.policies.items()
              if p.backend in ("tiny", "hf")}
    return variant(team, {"policies": models}, "resources.gpus")


def search_space(cfg: PBTConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tune's initial ``param_space`` and PBT's ``hyperparam_mutations``: a range samples
    (log-)uniformly; a list is categorical (PBT moves to a neighbouring value), which for
    topologies is a list of labels (:meth:`PBTConfig.topology_labels`)."""
    initial, mutations = {}, {}
    for name, space in cfg.mutations.items():
        if isinstance(space, Range):
            dist = (tune.loguniform if space.log else tune.uniform)(space.min, space.max)
            initial[name] = mutations[name] = dist
        else:
            values = list(cfg.topology_labels()) if name == "topology" else list(space)
            initial[name], mutations[name] = tune.choice(values), values
    return initial, mutations


def run_pbt(scenario: str | Path, cfg: PBTConfig, out: Path, address: str | None = None,
            resume: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run (or with ``resume`` continue) the population; write the outputs listed in the
    module docstring and return the contents of ``population.json``."""
    out = Path(out).resolve()
    scenario = str(Path(scenario).resolve())
    team = load_team(scenario)
    for k in range(cfg.members):  # every member's settings must build before Ray starts
        cfg.member_config(k)
    _check_mutations(team, cfg)
    experiment = out / "tune"
    if resume and not tune.Tuner.can_restore(str(experiment)):
        raise MarlError(f"--resume: {out} holds no population to continue (no Tune "
                        f"experiment in {experiment}); start it without --resume.")
    if not resume and experiment.exists():
        raise MarlError(f"{out} already holds a population; pass --resume to continue it or "
                        "choose another --out.")
    spec = MemberSpec(scenario=scenario, pbt=cfg, out=str(out))
    trainable = tune.with_resources(tune.with_parameters(member, spec=spec),
                                    cfg.resources.request())
    logging.getLogger("ray.tune.schedulers.pbt").setLevel(logging.WARNING)  # exploits.jsonl
    # A member restored before its first result has no result.json yet: Tune warns, harmlessly.
    logging.getLogger("ray.tune.logger.logger").setLevel(logging.ERROR)
    with ray_session(address, modules=task_modules(team)):
        if resume:
            log(f"resuming the population in {out} from Tune's experiment state")
            tuner = tune.Tuner.restore(str(experiment), trainable, resume_unfinished=True,
                                       resume_errored=True)
        else:
            tuner = _tuner(trainable, cfg, out)
        grid = tuner.fit()
    population = _population(grid, cfg, out)
    log(f"{len(population['members'])} members, {population['exploits']} exploits; "
        f"writing {out / 'population.json'}")
    unfinished = [m["id"] for m in population["members"] if m["steps"] < cfg.budget_steps]
    population["finished"] = not unfinished
    atomic_write_json(out / "population.json", population)
    if unfinished:
        raise MarlError(f"the population stopped before its budget ({cfg.budget_steps} steps): "
                        f"{', '.join(unfinished)} did not finish (interrupted, or failed more "
                        f"than max_failures={cfg.max_failures} times; see {experiment}). "
                        f"Continue it with --resume.")
    return population


def _check_mutations(team: Team, cfg: PBTConfig) -> None:
    """Each topology choice must fit the scenario (checked now, not in a worker)."""
    for label, spec in cfg.topology_labels().items():
        variant(team, {"topology": spec}, f"mutations.topology ({label})")


class TiesKeptPBT(PopulationBasedTraining):
    """Tune's PBT, except that a member scoring as well as the worst of the top quantile is
    not in the bottom one. Tune ranks ties arbitrarily, so once several members reach the
    same score (every member at eval success 1.0) it kept cloning equals into each other,
    throwing away each clone's work since its donor's last checkpoint."""

    def _quantiles(self) -> tuple[list, list]:
        lower, upper = super()._quantiles()
        if not upper:
            return lower, upper
        floor = min(self._trial_state[t].last_score for t in upper)
        return [t for t in lower if self._trial_state[t].last_score < floor], upper


def _tuner(trainable: Any, cfg: PBTConfig, out: Path) -> tune.Tuner:
    initial, mutations = search_space(cfg)
    scheduler = TiesKeptPBT(
        time_attr="step", perturbation_interval=cfg.perturbation_interval,
        hyperparam_mutations=mutations, quantile_fraction=cfg.quantile_fraction,
        resample_probability=cfg.resample_probability,
        perturbation_factors=cfg.perturbation_factors) if cfg.scheduler == "pbt" else None
    return tune.Tuner(
        trainable, param_space=initial,
        tune_config=tune.TuneConfig(scheduler=scheduler, metric="objective", mode="max",
                                    num_samples=cfg.members, reuse_actors=True,
                                    search_alg=BasicVariantGenerator(random_state=cfg.seed)),
        run_config=tune.RunConfig(
            name="tune", storage_path=str(out), verbose=0,
            # Tune stops a member that reports its last step before PBT can exploit it.
            stop={"step": cfg.budget_steps},
            # Every checkpoint is kept: a deleted donor checkpoint breaks a later exploit.
            checkpoint_config=tune.CheckpointConfig(num_to_keep=None),
            failure_config=tune.FailureConfig(max_failures=cfg.max_failures)))


def _trial_id(result: Any) -> str | None:
    """The Tune trial a result belongs to (as its rows say: after a restore its
    ``metrics`` can be a clone's)."""
    frame = result.metrics_dataframe
    if frame is None or frame.empty or "trial_id" not in frame:
        return None
    return str(frame["trial_id"].iloc[0])


def _population(grid: Any, cfg: PBTConfig, out: Path) -> dict[str, Any]:
    """``population.json`` and ``exploits.jsonl`` from the members' own records
    (``reports.jsonl``, ``lineage.jsonl``); ``best/`` from the member with the best final
    objective."""
    results = {_trial_id(r): r for r in grid}
    members, exploits = [], []
    for run_dir in sorted((out / "members").iterdir() if (out / "members").is_dir() else []):
        trial_id = run_dir.name
        reports = read_jsonl(run_dir / "reports.jsonl")
        lineage = read_jsonl(run_dir / "lineage.jsonl")
        for before, after in zip(lineage, lineage[1:], strict=False):
            if after["donor"]:
                exploits.append({"step": after["step"], "target": trial_id,
                                 "donor": after["donor"], "old": before["settings"],
                                 "new": after["settings"]})
        result = results.get(trial_id)
        final = {k: reports[-1].get(k) for k in REPORTED} if reports else None
        best = max(reports, key=lambda r: r["objective"]) if reports else None
        members.append({
            "id": trial_id, "run_dir": str(run_dir),
            "steps": reports[-1]["step"] if reports else 0,
            "history": [{"step": r["step"], "objective": r["objective"],
                         "settings": r["settings"]} for r in reports],
            "final": final, "best": {k: best.get(k) for k in REPORTED} if best else None,
            "cost_usd": reports[-1]["cost_usd"] if reports else 0.0,
            "error": str(result.error) if result is not None and result.error else None,
            "checkpoint": result.checkpoint.path if result is not None and result.checkpoint
            else None})
    exploits.sort(key=lambda e: (e["step"], e["target"]))
    atomic_write_text(out / "exploits.jsonl", "".join(json.dumps(e) + "\n" for e in exploits))
    ranked = [m for m in members if m["final"] and m["checkpoint"]]
    best = max(ranked, key=lambda m: m["final"]["objective"], default=None)
    if best is not None:
        shutil.rmtree(out / "best", ignore_errors=True)
        shutil.copytree(Path(best["checkpoint"]) / "trainer", out / "best")
    return {"objective": cfg.objective, "budget_steps": cfg.budget_steps,
            "members": members, "exploits": len(exploits),
            "best": None if best is None else {"id": best["id"], "final": best["final"],
                                               "settings": best["history"][-1]["settings"],
                                               "checkpoint": str(out / "best")}}
