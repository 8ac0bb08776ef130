"""The team of LLM agents as a PettingZoo ``ParallelEnv``.

One ``step()`` is one layer of the schedule: the agents of that layer act together, each
reading the messages its in-edges deliver. Observations and actions are text (gymnasium
``Text`` over :data:`~marl.tokenizer.CHARSET`, or :class:`UnicodeText` for an agent whose
tokenizer encodes any Unicode). Any action is legal input: empty, over-long (truncated to
the policy's token limit), outside the charset (replaced by ``?``), not a string at all;
each case is flagged in ``infos[agent]["flags"]``, never an exception. A symbol-code
message is one line (newlines become spaces); a free-form one (``Task.messages ==
"text"``) keeps its lines, which readers see framed (:mod:`marl.prompts`).
Agents not scheduled in the current layer observe a note saying so; their actions are
ignored and cost nothing. ``reset(options={"episode": i, "split": s})`` sets the episode
index written into ledger rows (default: one more than the last) and the task's instance
split (default ``train``; see :attr:`marl.tasks.Task.splits`).

Every transcript entry says whether the message has the task's format (``valid``) and
whether it equals what the task oracle would have sent from the same observation
(``oracle_agrees``). The result (in the final ``infos`` and ``env.result``) carries the
instance's structured data (``instance``: target, private values, meaning) and its split.

After the last layer of the last round the answer agents' final messages give the team
answer. Every agent then receives the team reward ``score − penalty_per_1k · tokens/1000``
(tokens = prompt + completion of the whole episode); ``infos`` carry both terms.
``infos[agent]["ledger"]`` holds that agent's ledger rows for the step.

Remote policies report what they billed and may fail: ``step(actions, usage=...,
errors=...)`` takes, per agent, the server's billed usage (the ledger row then records it)
and the reason a call finally failed. A failed call ends the episode as failed: the agent
says nothing, later turns of the episode are void (no call, no ledger row, flagged
``skipped``), and the result has score 0, success false and ``error``. Plain
``step(actions)`` is PettingZoo's API, unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium.spaces import Text
from pettingzoo import ParallelEnv

from marl import prompts
from marl.cost.ledger import LedgerRow, Usage, make_row, token_penalty
from marl.cost.predict import predict_team
from marl.errors import MarlError
from marl.scenario import Scenario
from marl.team import Team, load_team
from marl.tokenizer import CHARSET, CharTokenizer, Tokenizer, common_prefix

_MISSING = object()


Tokenizers = Mapping[str, Tokenizer] | Tokenizer | None


def make_env(scenario: str | Path | dict[str, Any] | Scenario | Team, seed: int | None = None,
             tokenizers: Tokenizers = None) -> TeamEnv:
    """Build the environment of a scenario (path, parsed data, model or resolved team)."""
    team = scenario if isinstance(scenario, Team) else load_team(scenario)
    return TeamEnv(team, seed=seed, tokenizers=tokenizers)


def per_agent(team: Team, tokenizers: Tokenizers) -> dict[str, Tokenizer]:
    """One tokenizer per agent: a mapping as given, one for all, or the built-in one."""
    if isinstance(tokenizers, Mapping):
        return {a: tokenizers[a] for a in team.ids}
    tok = tokenizers or CharTokenizer()
    return dict.fromkeys(team.ids, tok)


class UnicodeText(Text):
    """A gymnasium ``Text`` space holding any Unicode string within its length bounds (the
    text of a model whose tokenizer encodes any Unicode); samples are drawn from its
    ``charset``, as ``Text``'s are."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


@functools.lru_cache(maxsize=64)
def _spaces(team: Team, chars: tuple[int, ...],
            unicode: tuple[bool, ...]) -> tuple[dict[str, Text], dict[str, Text]]:
    """Observation and action spaces; ``chars[i]``: longest token of agent i, in characters;
    ``unicode[i]``: agent i's tokenizer encodes any Unicode.

    The observation bound is the longest prompt the agent can see, every message at its
    token limit (and the longest private text); it is computed once per team and shared by
    all its environments.
    """
    width = dict(zip(team.ids, chars, strict=True))
    kind = {a: UnicodeText if u else Text for a, u in zip(team.ids, unicode, strict=True)}
    bound = predict_team(team, CharTokenizer(),
                         completion=lambda a, r: team.max_new_tokens(a) * width[a],
                         model_input=False)
    longest = dict.fromkeys(team.ids, 0)
    for (a, _), c in bound.per_call.items():
        longest[a] = max(longest[a], c.prompt)
    note = len(prompts.waiting("x", team.rounds, team.topo.n_layers)) + 40
    obs = {a: kind[a](max(longest[a], note) + 32, charset=CHARSET) for a in team.ids}
    act = {a: kind[a](team.max_new_tokens(a) * width[a], min_length=0, charset=CHARSET)
           for a in team.ids}
    return obs, act


class TeamEnv(ParallelEnv):
    metadata = {"name": "llm_marl_team_v0", "render_modes": ["ansi"], "is_parallelizable": True}

    def __init__(self, team: Team, seed: int | None = None, tokenizers: Tokenizers = None,
                 render_mode: str | None = "ansi"):
        self.team = team
        self.tokenizers = per_agent(team, tokenizers)
        self.render_mode = render_mode
        self.possible_agents = list(team.ids)
        self.agents: list[str] = []
        self._seed = team.scenario.seed if seed is None else seed
        self._rng: np.random.Generator | None = None
        self.episode = -1
        chars = tuple(self.tokenizers[a].max_token_chars for a in team.ids)
        unicode = tuple(self.tokenizers[a].charset is None for a in team.ids)
        self._obs_space, self._act_space = _spaces(team, chars, unicode)

    def observation_space(self, agent: str) -> Text:
        return self._obs_space[agent]

    def action_space(self, agent: str) -> Text:
        return self._act_space[agent]

    @property
    def scheduled(self) -> tuple[str, ...]:
        """Agents acting in the current step (empty once the episode is over)."""
        return self.team.topo.layers[self.layer] if self.agents else ()

    def message(self, agent: str, rnd: int) -> str | None:
        """What ``agent`` sent in round ``rnd`` of this episode (None: nothing yet)."""
        return self._messages.get((agent, rnd))

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None or self._rng is None:
            self._rng = np.random.default_rng(self._seed if seed is None else seed)
        options = options or {}
        self.episode = options.get("episode", self.episode + 1)
        self.split = options.get("split", "train")
        self.instance = self.team.task.draw(self._rng, self.split)
        self.round, self.layer = 0, 0
        self.agents = list(self.possible_agents)
        self._history = {a.id: prompts.header(a.id, a.role, self._private(a.id),
                                              prompts.one_line(a.prompt))
                         for a in self.team.agents}
        self._history_tokens = {a: self.tokenizers[a].count(h) for a, h in self._history.items()}
        self._messages: dict[tuple[str, int], str] = {}
        self._pending: dict[str, tuple[str, int, int, dict[str, int]]] = {}
        self.rows: list[LedgerRow] = []
        self.transcript: list[dict[str, Any]] = []
        self.result: dict[str, Any] | None = None
        self.failure: str | None = None  # the first failed call's reason
        self.verify_s = 0.0  # seconds the task took to score the answer (Task.verdict)
        obs = self._observe()
        return obs, {a: self._info(a) for a in self.agents}

    def _private(self, agent: str) -> str:
        """The agent's private text as its tokenizer can read it (a dataset's Unicode
        becomes ``?`` for the tiny models' characters)."""
        return prompts.sanitize_text(self.instance.private[agent],
                                     self.tokenizers[agent].charset)[0]

    def _info(self, agent: str) -> dict[str, Any]:
        return {"round": self.round, "layer": self.layer,
                "scheduled": agent in self.scheduled,
                "final_call": self.team.is_final_call(agent, self.round), "ledger": [],
                "flags": {}}

    def _observe(self) -> dict[str, str]:
        obs = {}
        for a in self.agents:
            if a in self.scheduled:
                obs[a] = self._prompt(a)
            else:
                obs[a] = prompts.waiting(a, self.round, self.layer)
        return obs

    def _prompt(self, agent: str) -> str:
        """Build the agent's prompt for this round and remember its token counts."""
        tok, rnd = self.tokenizers[agent], self.round
        parts = [prompts.turn_open(rnd)]
        received: dict[str, int] = {}
        for src, src_round in self.team.topo.inbox(agent, rnd):
            line = prompts.message_line(src, self._messages[(src, src_round)])
            parts.append(line)
            received[src] = received.get(src, 0) + tok.count(line)
        parts.append(prompts.query(agent, self.team.is_final_call(agent, rnd)))
        history = self._history[agent]
        prompt = history + "".join(parts)
        if tok.prefix_stable:
            n_prompt = self._history_tokens[agent] + tok.count(prompt[len(history):])
            cached = self._history_tokens[agent] if rnd > 0 else 0
        else:
            ids = tok.encode(prompt)
            n_prompt = len(ids)
            cached = common_prefix(tok.encode(history), ids) if rnd > 0 else 0
        self._pending[agent] = (prompt, n_prompt, cached, received)
        return prompt

    def _clean(self, agent: str, raw: Any) -> tuple[str, dict[str, Any]]:
        """Any input becomes a legal message; what was changed is flagged."""
        flags: dict[str, Any] = {}
        if raw is _MISSING:
            flags["missing"] = True
            raw = ""
        elif not isinstance(raw, str):
            flags["invalid_type"] = type(raw).__name__
            raw = ""
        text, replaced = (prompts.sanitize_text(raw, self.tokenizers[agent].charset)
                          if self.team.task.messages == "text" else prompts.sanitize(raw))
        if replaced:
            flags["sanitized_chars"] = replaced
        tok = self.tokenizers[agent]
        ids = tok.encode(text)
        limit = self.team.max_new_tokens(agent)
        if len(ids) > limit:
            flags["truncated_from"] = len(ids)
            text = tok.decode(ids[:limit])
        if not text:
            flags["empty"] = True
        return text, flags

    def step(self, actions: dict[str, Any], usage: Mapping[str, Usage] | None = None,
             errors: Mapping[str, str] | None = None):
        """One layer. Beyond PettingZoo's ``actions``, a rollout may pass, per agent, the
        ``usage`` a server billed for its call (the ledger row then holds those numbers
        instead of our tokenizer's) and the ``errors`` of calls that finally failed: that
        agent says nothing, and the episode fails (see :meth:`_void`)."""
        if not self.agents:
            return {}, {}, {}, {}, {}
        usage, errors = usage or {}, errors or {}
        failed = self.failure is not None  # before this layer: its other calls were billed
        infos = {a: self._info(a) for a in self.agents}
        for a in actions:
            if a in infos and a not in self.scheduled:
                infos[a]["flags"]["ignored_action"] = True
        for a in self.scheduled:
            if failed or a in errors:
                infos[a]["flags"].update(self._void(a, errors.get(a)))
                continue
            text, flags = self._clean(a, actions.get(a, _MISSING))
            prompt, n_prompt, cached, received = self._pending.pop(a)
            n_out = self.tokenizers[a].count(text)
            billed = usage.get(a)
            # A server reports what it billed for the call, but not how many of those
            # tokens came over each in-edge: ``received`` stays counted by our tokenizer.
            counts = (n_prompt, cached, n_out) if billed is None else (
                billed.prompt_tokens, billed.cached_tokens, billed.completion_tokens)
            row = make_row(self.episode, self.round, self.layer, a, self.team.models[a],
                           self.team.prices[a], *counts, received)
            self.rows.append(row)
            self._messages[(a, self.round)] = text
            self._history[a] = prompt + text
            self._history_tokens[a] = n_prompt + n_out
            self._record(a, text, flags, prompt)
            infos[a]["ledger"] = [row]
            infos[a]["flags"].update(flags)
        self.layer += 1
        if self.layer == self.team.topo.n_layers:
            self.layer, self.round = 0, self.round + 1
        if self.round == self.team.rounds:
            return self._finish(infos)
        for a in self.agents:
            infos[a].update(round=self.round, layer=self.layer, scheduled=a in self.scheduled,
                            final_call=self.team.is_final_call(a, self.round))
        obs = self._observe()
        zeros = dict.fromkeys(self.agents, 0.0)
        falses = dict.fromkeys(self.agents, False)
        return obs, zeros, falses, dict(falses), infos

    def _record(self, agent: str, text: str, flags: dict[str, Any], prompt: str) -> None:
        final = self.team.is_final_call(agent, self.round)
        task = self.team.task
        self.transcript.append({"round": self.round, "layer": self.layer, "agent": agent,
                                "message": text, "flags": flags,
                                "valid": task.valid_message(agent, text, final),
                                "oracle_agrees": task.provides("oracle")
                                and task.oracle(agent, prompt, final) == text})

    def _void(self, agent: str, error: str | None) -> dict[str, Any]:
        """The turn of an agent whose call failed (``error``), or of any agent after that
        in a failed episode: it says nothing and costs nothing (no call was billed, and no
        call is made for the rest of the episode), and the episode's result is a failure
        carrying the first error. Returns the turn's flags."""
        prompt, n_prompt, *_ = self._pending.pop(agent)
        if error is not None and self.failure is None:
            self.failure = f"agent {agent!r}, round {self.round + 1}: {error}"
        flags = {"error": error} if error is not None else {"skipped": "the episode failed"}
        self._messages[(agent, self.round)] = ""
        self._history[agent], self._history_tokens[agent] = prompt, n_prompt
        self._record(agent, "", flags, prompt)
        return flags

    def _finish(self, infos: dict[str, dict[str, Any]]):
        last = self.team.rounds - 1
        task = self.team.task
        answers = {side: [self._messages[(a, last)] for a in voters]
                   for side, voters in self.team.side_answers.items()}
        team_answers = {side: task.team_answer(votes) for side, votes in answers.items()}
        reason = None
        if self.failure is not None:
            scores = dict.fromkeys(team_answers, 0.0)
        elif self.team.competitive:
            scores = task.score_sides(self.instance, team_answers)
        else:  # one side: its verdict may say why it scored 0, and took time to reach
            (side, answer), = team_answers.items()
            score, reason, self.verify_s = task.verdict(self.instance, answer)
            scores = {side: score}
        sides = {}
        for side, members in self.team.sides.items():
            used = sum(r.prompt_tokens + r.completion_tokens for r in self.rows
                       if r.agent in members)
            penalty = token_penalty(used, self.team.penalty_per_1k)
            sides[side] = {"answer": team_answers[side], "answers": answers[side],
                           "score": scores[side], "success": scores[side] >= 1.0,
                           "token_penalty": penalty, "reward": scores[side] - penalty,
                           "tokens": used}
        tokens = sum(r.prompt_tokens + r.completion_tokens for r in self.rows)
        cost = sum((r.cost_usd for r in self.rows), Decimal(0))
        # The first side is the one the top-level fields describe (the only one when the
        # scenario is cooperative); a competitive episode also lists every side.
        home = sides[next(iter(sides))]
        self.result = {**{k: home[k] for k in ("answer", "answers", "score", "success",
                                                 "token_penalty", "reward")},
                       "target": self.instance.answer, "tokens": tokens, "cost_usd": cost,
                       "split": self.split, "instance": self.instance.data}
        if self.team.competitive:
            self.result["sides"] = sides
        if self.failure is not None:
            self.result["error"] = self.failure
        if reason is not None:
            self.result["score_reason"] = reason
        done = self.agents
        obs = {a: f"{a}: episode over after {self.team.rounds} round(s)." for a in done}
        for a in done:
            infos[a].update(self.result, scheduled=False, final_call=False)
        rewards = {a: sides[self.team.side_of(a)]["reward"] for a in done}
        self.agents = []
        return obs, rewards, dict.fromkeys(done, True), dict.fromkeys(done, False), infos

    def record(self, group: int = 0, result: dict[str, Any] | None = None,
               rows: list[LedgerRow] | None = None) -> dict[str, Any]:
        """The finished episode as runs keep it (``episodes.jsonl``, ``episodes/*.jsonl``):
        the result, the instance's private texts, the transcript and the ledger rows.
        ``result`` and ``rows`` replace the episode's own (a wrapper that counts tokens
        differently)."""
        result = self.result if result is None else result
        if result is None:
            raise MarlError("the episode is not over yet; a record needs a finished episode.")
        rows = self.rows if rows is None else rows
        return {**{k: v for k, v in result.items() if k != "cost_usd"},
                "cost_usd": str(result["cost_usd"]), "group": group,
                "private": dict(self.instance.private), "transcript": self.transcript,
                "ledger": [r.to_json() for r in rows]}

    def render(self) -> str:
        """The transcript so far, one line per message."""
        lines = [f"[round {m['round'] + 1} layer {m['layer'] + 1}] {m['agent']}> {m['message']}"
                 for m in self.transcript]
        if self.result:
            lines.append(f"team answer {self.result['answer']!r} (target "
                         f"{self.result['target']!r}) score {self.result['score']}")
        return "\n".join(lines)

    def close(self) -> None:
        pass
