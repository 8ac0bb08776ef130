"""Format warm-up: supervised steps that teach each trainable policy the *form* of its
messages and answers before reinforcement learning starts.

Real LLM agents arrive pre-trained: they know how to write a well-formed message, not the
convention their team will settle on. A model trained from scratch knows neither, and
almost never emits a well-formed answer, so reward never arrives. The warm-up gives it the
same starting point as a pre-trained agent.

Each step, a *source* plays ``warmup_episodes`` whole episodes for every agent, and every
call of a trainable policy's agents becomes a target: what the source sent, after what the
agent read, ended with the policy's stop string. Sources:

- ``random`` (the default): the task's random policy. Its messages and answers have the
  task's format and carry no meaning (each is drawn uniformly, whatever was read), so the
  warmed-up team is well-formed and still at chance: anything it later achieves was
  discovered from reward.
- ``oracle``: the task oracle's demonstrations (where it would not only guess). This is
  imitation: a run that uses it is labelled ``uses_oracle``.

With a curriculum, step ``s`` plays the team of stage ``s mod stages``, so the form of
every stage's messages is learnt before the first.
"""

from __future__ import annotations

from collections.abc import Sequence

from marl import seeds
from marl.algorithms.common import Trainable, guarded_step, sft_term, target_ids
from marl.algorithms.config import TrainConfig
from marl.policies import Policy
from marl.policies.scripted import RandomPolicy, ScriptedPolicy
from marl.rollout import EpisodeBatch, collect
from marl.team import Team


def source_episodes(team: Team, source: str, episodes: int, seed: int) -> EpisodeBatch:
    """``episodes`` instances played by the task's ``random`` policy or its ``oracle`` for
    every agent."""
    player: Policy = (RandomPolicy(team.task, seed) if source == "random"
                      else ScriptedPolicy(team.task))
    return collect(team, dict.fromkeys(team.ids, player), episodes, 1, seed=seed)


def warmup_rows(t: Trainable, team: Team, batch: EpisodeBatch,
                source: str) -> tuple[list[tuple[int, ...]], list[list[int]]]:
    """Prompts and target ids of ``t``'s agents' calls in a source batch (``oracle``: its
    demonstrations, skipping calls where it would only guess)."""
    prompts, targets = [], []
    tok = t.policy.tokenizer
    for k in batch.slots(t.agents).tolist():
        agent = batch.agents[int(batch.call_agent[k])]
        final = team.is_final_call(agent, int(batch.call_round[k]))
        for b, record in enumerate(batch.records):
            obs = batch.observations[b][k]
            text = (record["transcript"][k]["message"] if source == "random"
                    else team.task.demonstration(agent, obs, final))
            if text is None:
                continue
            prompts.append(tuple(tok.encode_prompt(obs)))
            targets.append(target_ids(t, text))
    return prompts, targets


def warmup_step(trainables: Sequence[Trainable], teams: Sequence[Team], cfg: TrainConfig,
                step: int) -> tuple[dict[str, float], EpisodeBatch]:
    """One optimizer step per trainable policy on a fresh source batch; returns the mean
    SFT loss (``sft_loss``), the guard's counters, and the batch."""
    team = teams[step % len(teams)]
    batch = source_episodes(team, cfg.warmup_source, cfg.warmup_episodes,
                            seeds.derive_seed(cfg.seed, seeds.WARMUP, step))
    stats: dict[str, float] = {"sft_loss": 0.0, "grad_norm": 0.0, "skipped": 0.0}
    for t in trainables:
        prompts, targets = warmup_rows(t, team, batch, cfg.warmup_source)
        if not prompts:
            continue
        loss = sft_term(t, prompts, targets)
        out = guarded_step(t, loss, cfg)
        stats["sft_loss"] += float(loss.detach()) / len(trainables)
        stats["grad_norm"] += out["grad_norm"] / len(trainables)
        stats["skipped"] += out["skipped"]
    return stats, batch
