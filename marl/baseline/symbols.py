"""A team with fixed-size spaces, for classic MARL baselines (RLlib and the like).

:class:`SymbolEnv` wraps a scenario's :class:`~marl.env.TeamEnv` as a PettingZoo
``ParallelEnv`` whose agents are small neural agents exchanging discrete symbols, as in
the emergent-communication literature, rather than LLMs writing text:

Actions
    ``MultiDiscrete``: one symbol per character of the agent's messages, then one per
    character of its answer (when it answers), each a choice over the task's finite
    alphabet for that position (:meth:`marl.tasks.Task.symbols`). A message call uses the
    message part, the final call the answer part; the rest of the vector is ignored.
Observations
    ``Box(0, 1)``, a fixed-size vector of one-hot codes: the agent's private text, one
    character per position; every message it can receive over the whole episode (a
    presence bit, then one symbol per position, zeros until it arrives); its own earlier
    messages; the round; whether it acts now and whether it answers now; and, for agents
    that share a policy, which of them it is. Agents that share a policy share spaces (the
    shorter vectors are zero-padded), so one network can play them all.
Schedule, rewards, results
    As in ``TeamEnv``: one step is one layer, agents not scheduled act in vain
    (``infos[a]["scheduled"]``), every agent gets the team reward at the end.
Tokens
    A symbol is one token: a call's completion tokens are the symbols it sends, its
    prompt tokens the symbols it receives (not the text prompt an LLM would read). The
    ledger rows, the episode's ``tokens`` and ``cost_usd`` and the reward's token penalty
    all count symbols, priced with the scenario's price table.

Version history
    v0: initial version.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
from gymnasium.spaces import Box, MultiDiscrete
from pettingzoo import ParallelEnv

from marl.cost.ledger import LedgerRow, make_row, token_penalty
from marl.env import TeamEnv
from marl.errors import MarlError
from marl.team import Team
from marl.tokenizer import CHARSET

#: Probe instances drawn to measure the longest private text of each agent.
_PROBES = 64


@dataclass(frozen=True)
class AgentLayout:
    """Where each part of one agent's observation and action vectors lives."""

    message: tuple[str, ...]  # alphabet per position of its messages (empty: never sends)
    answer: tuple[str, ...]  # alphabet per position of its answer (empty: never answers)
    private_chars: int
    #: Every message it can read: (the round it is first read in, sender, sender's round,
    #: the sender's alphabets then).
    slots: tuple[tuple[int, str, int, tuple[str, ...]], ...]
    member: int  # its index among the agents of its policy
    members: int  # agents of its policy
    obs_size: int  # this policy's observation size (the longest of its agents)

    @property
    def nvec(self) -> list[int]:
        return [len(a) for a in self.message + self.answer]


def formats(team: Team, agent: str, rnd: int) -> tuple[str, ...]:
    """The per-position alphabets of what ``agent`` sends in round ``rnd``."""
    symbols = team.task.symbols(agent, team.is_final_call(agent, rnd))
    if symbols is None:
        raise MarlError(f"task {team.task.id} does not say which finite alphabet its messages "
                        "are drawn from (Task.symbols returns None), so it has no fixed-size "
                        "action space for a classic MARL baseline; baselines need a task whose "
                        "messages and answers are fixed-length strings over finite alphabets.")
    return symbols


@functools.lru_cache(maxsize=64)  # a Team hashes by identity; every env of it shares this
def layouts(team: Team) -> dict[str, AgentLayout]:
    """Every agent's layout; agents that share a policy must send in the same formats."""
    rng = np.random.default_rng(0)
    private = dict.fromkeys(team.ids, 0)
    for _ in range(_PROBES):
        for split in team.task.splits:
            inst = team.task.draw(rng, split)
            for a in team.ids:
                private[a] = max(private[a], len(inst.private[a]))
    draft = {}
    for a in team.ids:
        message = answer = ()
        for r in range(team.rounds):
            sent = formats(team, a, r)
            if team.is_final_call(a, r):
                answer = sent
            else:
                message = sent
        # An LLM's prompt keeps its history: what it read, and what it said, in earlier rounds.
        first_read: dict[tuple[str, int], int] = {}
        for r in range(team.rounds):
            for sent in [*team.topo.inbox(a, r), *([(a, r - 1)] if r else [])]:
                first_read.setdefault(sent, r)
        slots = tuple((r, s, sr, formats(team, s, sr)) for (s, sr), r in first_read.items())
        draft[a] = (message, answer, slots)
    by_policy: dict[str, list[str]] = {}
    for ag in team.agents:
        by_policy.setdefault(ag.policy, []).append(ag.id)
    out = {}
    for policy, members in by_policy.items():
        # One network acts for every agent of a policy: one message format for those that
        # send, one answer format for those that answer.
        shared: list[tuple[str, ...]] = [(), ()]
        for part in (0, 1):
            for a in members:
                mine = draft[a][part]
                if mine and shared[part] and mine != shared[part]:
                    kind = ("messages", "answers")[part]
                    raise MarlError(f"agents of policy {policy!r} send {kind} of different "
                                    f"formats ({a!r} among them), so one network cannot act "
                                    "for all of them; give them separate policies.")
                shared[part] = shared[part] or mine
        sizes = {a: _size(team, private[a], draft[a][2], len(members)) for a in members}
        for i, a in enumerate(members):
            out[a] = AgentLayout(shared[0], shared[1], private[a], draft[a][2], i,
                                 len(members), max(sizes.values()))
    return {a: out[a] for a in team.ids}


def _size(team: Team, private_chars: int,
          slots: tuple[tuple[int, str, int, tuple[str, ...]], ...], members: int) -> int:
    """Observation length: private text, every readable message (presence bit and symbols),
    the round, the acting and answering bits, and the member one-hot (shared policies)."""
    read = sum(1 + sum(len(a) for a in alphabets) for *_, alphabets in slots)
    members_part = members if members > 1 else 0
    return private_chars * len(CHARSET) + read + team.rounds + 2 + members_part


def one_hot(text: str, alphabets: tuple[str, ...]) -> np.ndarray:
    """One block per position, one-hot over that position's alphabet; a character outside
    it (or missing) leaves its block zero.

    >>> one_hot("b?", ("ab", "ab")).tolist()
    [0.0, 1.0, 0.0, 0.0]
    """
    blocks = []
    for i, alphabet in enumerate(alphabets):
        block = np.zeros(len(alphabet), np.float32)
        if i < len(text) and text[i] in alphabet:
            block[alphabet.index(text[i])] = 1.0
        blocks.append(block)
    return np.concatenate(blocks) if blocks else np.zeros(0, np.float32)


class SymbolEnv(ParallelEnv):
    """A scenario's team with ``MultiDiscrete`` actions and ``Box`` observations."""

    metadata = {"name": "llm_marl_symbols_v0", "render_modes": ["ansi"],
                "is_parallelizable": True}

    def __init__(self, team: Team, seed: int | None = None):
        self.team = team
        self.env = TeamEnv(team, seed=seed)
        self.layout = layouts(team)
        self.possible_agents = list(team.ids)
        self.render_mode = "ansi"
        self.rows: list[LedgerRow] = []
        self.result: dict[str, Any] | None = None

    @property
    def agents(self) -> list[str]:  # type: ignore[override]
        return self.env.agents

    @functools.cache  # noqa: B019  (PettingZoo wants the same object)
    def observation_space(self, agent: str) -> Box:
        return Box(0.0, 1.0, (self.layout[agent].obs_size,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> MultiDiscrete:
        return MultiDiscrete(self.layout[agent].nvec)

    @property
    def scheduled(self) -> tuple[str, ...]:
        return self.env.scheduled

    def reset(self, seed: int | None = None, options: dict | None = None):
        self.env.reset(seed=seed, options=options)
        self.rows, self.result = [], None
        return self._observe(), {a: self._info(a) for a in self.agents}

    def _info(self, agent: str) -> dict[str, Any]:
        return {"scheduled": agent in self.env.scheduled,
                "final_call": self.team.is_final_call(agent, self.env.round)}

    def decode(self, agent: str, action: Any) -> str:
        """The text of an action vector in the current call of ``agent``."""
        lay = self.layout[agent]
        choice = [int(x) for x in np.asarray(action).reshape(-1)]
        if self.team.is_final_call(agent, self.env.round):
            choice, alphabets = choice[len(lay.message):], lay.answer
        else:
            alphabets = lay.message
        return "".join(alph[c % len(alph)] for alph, c in zip(alphabets, choice, strict=False))

    def encode(self, agent: str) -> np.ndarray:
        """``agent``'s observation vector now."""
        team, env, lay = self.team, self.env, self.layout[agent]
        private = env.instance.private[agent]
        parts = [one_hot(private, (CHARSET,) * lay.private_chars)]
        for read_in, sender, rnd, alphabets in lay.slots:
            text = env.message(sender, rnd) if read_in <= env.round else None
            present = np.array([0.0 if text is None else 1.0], np.float32)
            parts += [present, one_hot(text or "", alphabets)]
        parts.append(np.eye(team.rounds, dtype=np.float32)[min(env.round, team.rounds - 1)])
        parts.append(np.array([agent in env.scheduled,
                               team.is_final_call(agent, env.round)], np.float32))
        if lay.members > 1:
            parts.append(np.eye(lay.members, dtype=np.float32)[lay.member])
        vec = np.concatenate(parts)
        return np.pad(vec, (0, lay.obs_size - len(vec)))

    def _observe(self) -> dict[str, np.ndarray]:
        return {a: self.encode(a) for a in self.agents}

    def step(self, actions: dict[str, Any]):
        if not self.agents:
            return {}, {}, {}, {}, {}
        env, team = self.env, self.team
        rnd, layer = env.round, env.layer
        texts = {a: self.decode(a, actions[a]) for a in env.scheduled if a in actions}
        for a in env.scheduled:
            received = {s: len(env.message(s, r) or "") for s, r in team.topo.inbox(a, rnd)}
            sent = len(texts.get(a, ""))
            self.rows.append(make_row(env.episode, rnd, layer, a, team.models[a],
                                      team.prices[a], sum(received.values()), 0, sent,
                                      received))
        _, rewards, terms, truncs, team_infos = env.step(texts)
        infos = {a: {**self._info(a), "flags": team_infos[a]["flags"]} for a in team_infos}
        if env.result is not None:
            rewards = self._finish(infos)
            obs = {a: np.zeros(self.layout[a].obs_size, np.float32) for a in infos}
        else:
            obs = self._observe()
        return obs, rewards, terms, truncs, infos

    def _finish(self, infos: dict[str, dict[str, Any]]) -> dict[str, float]:
        """The result with symbols as tokens: cost, token penalty and reward recounted."""
        team, result = self.team, dict(self.env.result or {})
        rewards = {}
        for side, members in team.sides.items():
            used = sum(r.prompt_tokens + r.completion_tokens for r in self.rows
                       if r.agent in members)
            penalty = token_penalty(used, team.penalty_per_1k)
            score = result["sides"][side]["score"] if team.competitive else result["score"]
            if team.competitive:
                result["sides"][side] = {**result["sides"][side], "tokens": used,
                                         "token_penalty": penalty, "reward": score - penalty}
            for a in members:
                rewards[a] = score - penalty
            if side == next(iter(team.sides)):
                result.update(token_penalty=penalty, reward=score - penalty)
        result["tokens"] = sum(r.prompt_tokens + r.completion_tokens for r in self.rows)
        result["cost_usd"] = sum((r.cost_usd for r in self.rows), Decimal(0))
        self.result = result
        for a in infos:
            infos[a].update(score=float(result["score"]), success=bool(result["success"]),
                            reward=float(rewards[a]), tokens=int(result["tokens"]),
                            cost_usd=float(result["cost_usd"]))
        return {a: float(rewards[a]) for a in infos}

    def record(self, group: int = 0) -> dict[str, Any]:
        """The finished episode as ``marl run`` and ``marl train`` record it (transcript,
        result, instance data), with the symbol ledger."""
        if self.result is None:
            raise MarlError("the episode is not over yet; a record needs a finished episode.")
        return self.env.record(group, self.result, self.rows)

    def render(self) -> str:
        return self.env.render()

    def close(self) -> None:
        self.env.close()
