"""Every random stream of a run, named, and how its seeds are derived.

A run has one integer seed. Each consumer of randomness draws from its own stream,
``derive_seed(seed, STREAM, *indices)``, so streams never share draws and adding a new
consumer never shifts an existing one: the same seed gives the same run, and a resumed
run (whose streams are indexed by iteration) the same results as an uninterrupted one.
"""

from __future__ import annotations

import numpy as np

#: Task instances of a batch: ``derive_seed(batch_seed, INSTANCE, i)``.
INSTANCE = 0
#: Sampling randomness of policy ``p`` in a batch: ``(batch_seed, POLICY, p, first)``.
POLICY = 1
#: The batch of training iteration ``i``: ``(run_seed, TRAIN, i)``.
TRAIN = 2
#: Held-out evaluation instances: ``(run_seed, EVAL)``.
EVAL = 3
#: Initial weights of the policies: ``(run_seed, INIT)``.
INIT = 4
#: Initial weights of PPO critic ``i``: ``(run_seed, CRITIC_INIT, i)``.
CRITIC_INIT = 5
#: Minibatch order of PPO critic ``i``: ``(batch_seed, CRITIC_SHUFFLE, i)``.
CRITIC_SHUFFLE = 6
#: Oracle-played demonstration episodes: ``(batch_seed, DEMO)``.
DEMO = 7
#: Episodes of warm-up step ``s``: ``(run_seed, WARMUP, s)``.
WARMUP = 8
#: Minibatch order of policy ``j``'s update: ``(batch_seed, SHUFFLE, j)``.
SHUFFLE = 9
#: The warm-up's habits: the message an agent learns for an observation,
#: ``(run_seed, HABITS, crc32(agent), crc32(observation), attempt)``.
HABITS = 10
#: A league's opponent draws, learner iterations and matches.
LEAGUE = 11
#: Replays of ``marl analyze`` (interventions on a checkpoint): ``(seed, ANALYSIS)``.
ANALYSIS = 12
#: ``promotion_warmup`` on reaching curriculum stage ``k``: the greedy episodes that show
#: the team's code, ``(run_seed, PROMOTION, k)``, and step ``s``'s, ``(run_seed, PROMOTION,
#: k, s)``.
PROMOTION = 13


def derive_seed(seed: int, *path: int) -> int:
    """An independent 32-bit seed for one stream of a run.

    >>> derive_seed(0, TRAIN, 5) == derive_seed(0, TRAIN, 5) != derive_seed(0, TRAIN, 6)
    True
    """
    return int(np.random.SeedSequence([seed, *path]).generate_state(1)[0])


def instance_seed(seed: int, index: int) -> int:
    """Seed of task instance ``index`` in a batch seeded with ``seed``."""
    return derive_seed(seed, INSTANCE, index)
