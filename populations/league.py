"""A self-play league on a competitive scenario (two teams), in the manner of AlphaStar's
league with one main player and one main exploiter.

A player holds a policy for every agent of both teams. After the format warm-up (self-play,
as in ``marl train``) the main player's weights become snapshot ``s000``. Each generation
the main player draws one snapshot by prioritised fictitious self-play (PFSP, from its win
rates against them), trains ``iterations_per_generation`` MAGRPO iterations against that
frozen opponent, alternating the team it plays so both of its teams learn (each from its
own team's reward), then plays a match against every snapshot, in parallel as Ray tasks,
and joins the league as a new snapshot (``sNNN``) when its mean win rate reaches
``snapshot_win_rate``. The main exploiter (``exploiters: true``) trains as many iterations
against the main player's latest weights only; when it beats them it joins the league
(``xNNN``), so the main player has to learn to beat its weakness, and starts over from
``s000``. At the end every pair of snapshots plays a match; every game feeds openskill
ratings.

A match between players A and B is ``match_episodes`` games with A on the first team and B
on the second plus as many the other way round; a game is won by the team whose score is
higher (the task is zero-sum), a tie is a draw.

Output directory::

    league.jsonl     every training iteration: player, generation, team, opponent, reward
    generations.jsonl  after each generation: the main player's win rate against every
                     snapshot, and who joined
    snapshots/       every snapshot's weights (marl run SCENARIO --checkpoint snapshots/s001)
    ratings.json     every snapshot's rating (mu, sigma, ordinal = mu - 3 sigma)
    winrates.json    the round robin: players and matrix[i][j] = i's win rate against j
    league.png       ratings by snapshot and the win-rate matrix

Not built yet: league exploiters (AlphaStar's third kind) and several main players.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import ray

from marl import seeds
from marl.algorithms import learner_class
from marl.algorithms.common import begin_rl
from marl.cluster import gather, ray_session, task_modules
from marl.errors import MarlError
from marl.io import append_jsonl, atomic_dir, atomic_write_json
from marl.rollout import collect
from marl.runner import build_policies
from marl.seeds import derive_seed
from marl.team import Team, load_team
from marl.training.trainer import Trainer
from populations.config import LeagueConfig
from populations.ratings import Ratings, pfsp_weights


def games(team: Team, first: dict, second: dict, episodes: int, seed: int) -> list[float]:
    """Player ``first``'s results (1 win, 0.5 draw, 0 loss) in ``episodes`` games on each
    team against ``second`` (policies by agent id)."""
    out: list[float] = []
    for k, side in enumerate(team.sides):
        mixed = {a: first[a] if team.side_of(a) == side else second[a] for a in team.ids}
        batch = collect(team, mixed, episodes, 1, seed=derive_seed(seed, k))
        out += [1.0 if v > 0 else 0.5 if v == 0 else 0.0 for v in batch.side_score[:, k].tolist()]
    return out


@ray.remote(max_retries=3)  # a match is seeded: a retry after a lost worker plays it again
def match(scenario: str, first: str, second: str, episodes: int, seed: int) -> list[float]:
    """:func:`games` between two saved players (checkpoint directories), on a Ray worker."""
    team = load_team(scenario)
    return games(team, build_policies(team, checkpoint=Path(first)),
                 build_policies(team, checkpoint=Path(second)), episodes, seed)


class Player:
    """A player that learns: a policy for every agent of both teams and, per team, a
    learner that trains only that team's policies from that team's reward."""

    def __init__(self, name: str, team: Team, policies: dict, cfg: Any):
        self.name, self.team, self.policies, self.cfg = name, team, policies, cfg
        self.learners = {}
        for side, members in team.sides.items():
            learner = learner_class(cfg.algorithm)(team, policies, cfg)
            learner.trainables = [t for t in learner.trainables if t.agents[0] in members]
            shared = [t.name for t in learner.trainables if not set(t.agents) <= set(members)]
            if shared:
                raise MarlError(f"policies {', '.join(shared)} are played by agents of more "
                                "than one team; in a league each team needs policies of its "
                                "own.")
            begin_rl(learner.trainables, cfg)
            self.learners[side] = learner

    def snapshot(self, path: Path) -> Path:
        """The current weights, one folder per policy (``--checkpoint``-loadable)."""
        def write(tmp: Path) -> None:
            for learner in self.learners.values():
                for t in learner.trainables:
                    t.policy.save(tmp / t.name)

        return atomic_dir(path, write)

    def train(self, opponent: dict, opponent_name: str, iterations: int, seed: int,
              log_to: Path, generation: int) -> None:
        """``iterations`` updates against a frozen ``opponent``, alternating the team
        played; one row per iteration in ``log_to``."""
        sides = list(self.team.sides)
        for it in range(iterations):
            side = sides[it % 2]
            mixed = {a: self.policies[a] if self.team.side_of(a) == side else opponent[a]
                     for a in self.team.ids}
            step_seed = derive_seed(seed, it)
            batch = collect(self.team, mixed, self.cfg.episodes_per_iter, self.cfg.group_size,
                            seed=step_seed)
            stats = self.learners[side].update(batch, step_seed)
            k = sides.index(side)
            reward = batch.side_score[:, k] - batch.side_penalty[:, k]
            append_jsonl(log_to, {
                "player": self.name, "generation": generation, "iteration": it,
                "side": side, "opponent": opponent_name, "reward_mean": float(reward.mean()),
                "win_rate": float((batch.side_score[:, k] > 0).float().mean()),
                "loss": stats.get("loss", 0.0)})


def _matches(scenario: str, player: Path, opponents: list[Path], cfg: LeagueConfig,
             seed: int) -> list[float]:
    """``player``'s win rate against each opponent, the matches run as parallel Ray tasks."""
    results = gather([match.options(num_cpus=cfg.resources.cpus).remote(
        scenario, str(player), str(o), cfg.match_episodes, derive_seed(seed, i))
        for i, o in enumerate(opponents)], cfg.match_timeout_s,
        f"the matches of {player.name} against {len(opponents)} players", "match_timeout_s")
    return [statistics.mean(r) for r in results]


def check_two_teams(team: Team) -> None:
    if len(team.sides) != 2:
        raise MarlError(f"a league needs a competitive scenario with two teams; {team.name} "
                        f"has {len(team.sides)} ({', '.join(team.sides)}). Give it teams: "
                        "{red: {agents: [...], answer: ...}, blue: {...}} and a competitive "
                        "task (cipher_v0).")


def run_league(scenario: str | Path, cfg: LeagueConfig, out: Path, address: str | None = None,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the league; write the outputs listed in the module docstring and return the
    contents of ``ratings.json`` and ``winrates.json``."""
    out, scenario = Path(out).resolve(), str(Path(scenario).resolve())
    team = load_team(scenario)
    check_two_teams(team)
    if (out / "league.jsonl").exists():
        raise MarlError(f"{out} already holds a league; choose another --out.")
    trainer = Trainer(team, cfg.train_config(), out / "learner", log=lambda m: None)
    while trainer.phase == "warmup":  # the format warm-up, in self-play
        trainer.step()
    if trainer.warmed:
        log(f"warm-up: {trainer.warmed} steps")
    main = Player("main", team, trainer.policies, trainer.cfg)
    snapshots = [main.snapshot(out / "snapshots" / "s000")]
    win_rates = [0.5]
    exploiter = _exploiter(team, snapshots[0], trainer.cfg) if cfg.exploiters else None
    rng = np.random.default_rng(derive_seed(cfg.seed, seeds.LEAGUE))
    with ray_session(address, modules=task_modules(team)):
        for gen in range(cfg.generations):
            j = int(rng.choice(len(snapshots), p=pfsp_weights(win_rates, cfg.pfsp)))
            main.train(build_policies(team, checkpoint=snapshots[j]), snapshots[j].name,
                       cfg.iterations_per_generation, derive_seed(cfg.seed, seeds.LEAGUE, gen),
                       out / "league.jsonl", gen)
            current = main.snapshot(out / "learner" / "current")
            note = ""
            if exploiter is not None:  # trains against the main player's latest weights only
                exploiter.train(build_policies(team, checkpoint=current), "main",
                                cfg.iterations_per_generation,
                                derive_seed(cfg.seed, seeds.LEAGUE, gen, 1),
                                out / "league.jsonl", gen)
                trial = exploiter.snapshot(out / "learner" / "exploiter")
                [beats] = _matches(scenario, trial, [current], cfg,
                                   derive_seed(cfg.seed, seeds.LEAGUE, gen, 2))
                if beats >= cfg.snapshot_win_rate:  # it found a weakness: keep it, start over
                    snapshots.append(exploiter.snapshot(
                        out / "snapshots" / f"x{len(snapshots):03d}"))
                    win_rates.append(0.5)
                    exploiter = _exploiter(team, snapshots[0], trainer.cfg)
                    note = f"; the exploiter beat it {beats:.2f} and joins as {snapshots[-1].name}"
            win_rates = _matches(scenario, current, snapshots, cfg,
                                 derive_seed(cfg.seed, seeds.LEAGUE, gen, 3))
            joined = statistics.mean(win_rates) >= cfg.snapshot_win_rate
            mean = statistics.mean(win_rates)
            if joined:
                snapshots.append(main.snapshot(out / "snapshots" / f"s{len(snapshots):03d}"))
                win_rates.append(0.5)
            append_jsonl(out / "generations.jsonl", {
                "generation": gen, "opponent": snapshots[j].name,
                "win_rates": dict(zip([s.name for s in snapshots], win_rates, strict=True)),
                "new_snapshot": snapshots[-1].name if joined else None})
            log(f"generation {gen + 1}/{cfg.generations}: trained against "
                f"{snapshots[j].name}; win rate against the league {mean:.2f}"
                + (f"; joins as {snapshots[-1].name}" if joined else "") + note)
        return _round_robin(scenario, snapshots, cfg, out, log)


def _exploiter(team: Team, start: Path, cfg: Any) -> Player:
    """A main exploiter, (re)starting from the warmed-up weights of ``start``."""
    return Player("exploiter", team, build_policies(team, checkpoint=start), cfg)


def _round_robin(scenario: str, snapshots: list[Path], cfg: LeagueConfig, out: Path,
                 log: Callable[[str], None]) -> dict[str, Any]:
    names = [s.name for s in snapshots]
    pairs = list(itertools.combinations(range(len(snapshots)), 2))
    results = gather([match.options(num_cpus=cfg.resources.cpus).remote(
        scenario, str(snapshots[i]), str(snapshots[j]), cfg.match_episodes,
        derive_seed(cfg.seed, seeds.LEAGUE, i, j, 2)) for i, j in pairs], cfg.match_timeout_s,
        f"the round robin's {len(pairs)} matches", "match_timeout_s")
    matrix: list[list[float | None]] = [[None] * len(names) for _ in names]
    if len(snapshots) < 2:
        log("the league has one snapshot: no round robin, no ratings to compare")
    ratings = Ratings()
    for name in names:
        ratings.add(name)
    for (i, j), played in zip(pairs, results, strict=True):
        matrix[i][j] = statistics.mean(played)
        matrix[j][i] = 1 - matrix[i][j]
        for g in played:
            ratings.game(names[i], names[j], g)
    table = ratings.table()
    winrates = {"players": names, "matrix": matrix, "games_per_pair": 2 * cfg.match_episodes}
    atomic_write_json(out / "ratings.json", table)
    atomic_write_json(out / "winrates.json", winrates)
    _plot(table, winrates, out / "league.png")
    if len(names) > 1:
        first, last = table[names[0]], table[names[-1]]
        log(f"ratings: first snapshot {names[0]} {first['mu']:.2f} ± {first['sigma']:.2f}, "
            f"latest {names[-1]} {last['mu']:.2f} ± {last['sigma']:.2f}; the latest wins "
            f"{matrix[-1][0]:.2f} of its games against the first")
    return {"ratings": table, "winrates": winrates}


def _plot(table: dict, winrates: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = winrates["players"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.errorbar(range(len(names)), [table[n]["mu"] for n in names],
                  yerr=[3 * table[n]["sigma"] for n in names], fmt="o-")
    left.set_xticks(range(len(names)), names)
    left.set_xlabel("snapshot")
    left.set_ylabel("rating mu ± 3 sigma")
    grid = np.array([[np.nan if v is None else v for v in row] for row in winrates["matrix"]])
    image = right.imshow(grid, vmin=0, vmax=1, cmap="RdBu")
    right.set_xticks(range(len(names)), names)
    right.set_yticks(range(len(names)), names)
    for i, row in enumerate(winrates["matrix"]):
        for j, v in enumerate(row):
            if v is not None:
                right.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8)
    right.set_title("win rate of row against column")
    fig.colorbar(image, ax=right)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
