"""PPO for LLM teams: a learned critic and token-level GAE, per agent (IPPO) or central
(MAPPO).

Every agent call is a sequence of completion tokens ``t = 1..T``. The critic gives a value
``V(s_t)`` for every prefix ``s_t`` = (what it reads before the call, tokens ``< t``). The
team reward ``R = score − token penalty`` arrives at the call's last token, after which the
call is over (value 0)::

    r_t = R·[t = T]
    δ_t = r_t + γ·V(s_{t+1}) − V(s_t)              V(s_{T+1}) = 0
    A_t = δ_t + γλ·A_{t+1}                          (marl.kernels.gae; masked tokens skipped)
    G_t = A_t + V_old(s_t)                          value targets (old values, detached)
    Â_t = (A_t − mean A) / (std A + 1e-8)           over the valid tokens of one policy

    L_policy = clipped-ratio loss on Â, + KL, entropy, SFT    (marl.algorithms.common)
    L_value  = value_coef · ½ · mean_t (V(s_t) − G_t)²       over valid tokens

Critics (``critic``):

- ``independent`` (IPPO): one critic per trainable policy, shared by that policy's agents.
  It reads exactly what the policy reads: the agent's prompt ids, then its completion.
- ``central`` (MAPPO): one critic for every agent of every trainable policy. Before call
  ``k`` of an episode it reads :func:`joint_observation`: the first observation line of
  every agent that acts (its name, role and private information: ``target: kqz``,
  ``candidates: ...``), every message sent at earlier steps (round, layer) of the episode,
  whoever it was sent to, and the acting agent's own prompt; then the agent's completion.
  All trainable policies must share one tokenizer, since it reads their tokens.

A critic is a ``TinyLM`` of the ``tiny`` preset over the policy tokenizer's vocabulary
whose output projection is a scalar value head, with its own Adam (``lr``), gradient
clipping (``max_grad_norm``) and non-finite guard, on the device of its (first) policy.

Where this departs from PPO (Schulman et al., 2017) and MAPPO (Yu et al., 2022):

- Actor and critic are separate networks with separate optimizers, so ``value_coef`` only
  scales the critic's gradient before clipping (with Adam that matters little).
- Each call is its own episode: every call receives the team reward at its last token and
  nothing is bootstrapped across an agent's rounds (``last_value = 0``).
- Advantages are normalised once per policy and batch, not per minibatch; values are not
  clipped. The policy takes its steps first, then the critic (its own shuffle).
- The task oracle's messages can be mixed in (``sft_coef``, decaying by ``sft_decay``), as
  in :mod:`marl.algorithms.magrpo`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from marl import seeds
from marl.algorithms.common import (
    Trainable,
    adam,
    optimizer_step,
    oracle_episodes,
    policy_updates,
    rollout_cost,
    trainables,
)
from marl.algorithms.config import TrainConfig
from marl.errors import MarlError
from marl.kernels import gae
from marl.policies.generation import left_pad
from marl.policies.lm import LMTokenizer
from marl.policies.tiny import TinyLM
from marl.policies.tiny_config import TinyConfig
from marl.rollout import EpisodeBatch
from marl.seeds import derive_seed
from marl.team import Team


class ValueNet(nn.Module):
    """A ``TinyLM`` whose output projection is a scalar head: ``(B, T)`` ids -> values."""

    def __init__(self, vocab_size: int):
        super().__init__()
        cfg = TinyConfig(vocab_size=vocab_size, tie_embeddings=False)  # the tiny preset
        self.trunk = TinyLM(cfg)
        self.trunk.head = nn.Linear(cfg.n_embd, 1)  # replaces the (n_embd, vocab) projection
        nn.init.normal_(self.trunk.head.weight, std=0.02)
        nn.init.zeros_(self.trunk.head.bias)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.trunk(ids, mask)[..., 0]


@dataclass
class Critic:
    """One value function, the agents whose calls it values, and how it reads them."""

    name: str
    net: ValueNet
    optimizer: torch.optim.Optimizer
    agents: list[str]
    tokenizer: LMTokenizer
    device: torch.device
    central: bool


@dataclass
class CriticInputs:
    """A critic's rows of a batch: calls ``(b, k)`` with at least one generated token."""

    rows: list[tuple[int, int]]
    contexts: list[list[int]]
    completions: list[list[int]]


def joint_observation(batch: EpisodeBatch, b: int, k: int) -> str:
    """What the central critic reads before call slot ``k`` of episode ``b``::

        [team]
        <first observation line of every acting agent, in team order: "you are a (role). …">
        [said]
        <"agent> message" for every message of an earlier (round, layer), in schedule order>
        [acting]
        <the acting agent's own observation, i.e. its prompt>
    """
    first: dict[int, str] = {}
    for j, a in enumerate(batch.call_agent.tolist()):
        first.setdefault(a, batch.observations[b][j].split("\n", 1)[0])
    transcript = batch.records[b]["transcript"]
    now = (transcript[k]["round"], transcript[k]["layer"])
    said = [f"{e['agent']}> {e['message']}" for e in transcript
            if (e["round"], e["layer"]) < now]
    return "\n".join(["[team]", *(first[a] for a in sorted(first)), "[said]", *said,
                      "[acting]", batch.observations[b][k]])


def predict(net: ValueNet, contexts: list[list[int]], completions: list[list[int]],
            pad_id: int, device: torch.device) -> torch.Tensor:
    """Values ``(S, n)`` of each completion token's prefix, left-aligned like
    :func:`marl.policies.generation.score` (``n``: longest completion; 0 past the end)."""
    ids, mask = left_pad([c + x for c, x in zip(contexts, completions, strict=True)], pad_id,
                         device)
    v = net(ids, mask)  # (S, T); row i ends at column T − 1
    width = v.shape[1]
    n = max(len(x) for x in completions)
    lengths = torch.tensor([len(x) for x in completions], device=device)
    # Token i of a length-m completion sits at column T − m + i; its state is one before.
    col = (width - lengths - 1)[:, None] + torch.arange(n, device=device)
    out = v.gather(1, col.clamp(0, width - 1))
    return out.masked_fill(torch.arange(n, device=device) >= lengths[:, None], 0.0)


class PPO:
    def __init__(self, team: Team, policies: dict, cfg: TrainConfig):
        self.team, self.policies, self.cfg = team, policies, cfg
        self.trainables: list[Trainable] = trainables(team, policies, cfg)
        self.sft_coef = cfg.sft_coef
        if team.competitive and cfg.critic == "central":
            raise MarlError(f"critic: central values the joint transcript for one team's "
                            f"return; {team.name} has teams ({', '.join(team.sides)}) with "
                            "returns of their own. Use critic: independent.")
        if cfg.critic == "central":
            groups = [("central", [a for t in self.trainables for a in t.agents],
                       self.trainables[0])] if self.trainables else []
            self._check_tokenizers()
        else:
            groups = [(t.name, t.agents, t) for t in self.trainables]
        self.critics = [self._critic(name, agents, t, i)
                        for i, (name, agents, t) in enumerate(groups)]

    def _check_tokenizers(self) -> None:
        seen = {(t.policy.tokenizer.name, t.policy.tokenizer.vocab_size): t.name
                for t in self.trainables}
        if len(seen) > 1:
            found = ", ".join(f"{name} uses {tok} ({size} ids)" for (tok, size), name
                              in seen.items())
            raise MarlError(f"critic: central reads every policy's tokens with one critic, "
                            f"so the trainable policies need one tokenizer; {found}. Set "
                            "critic: independent, or give the policies the same tokenizer.")

    def _critic(self, name: str, agents: list[str], t: Trainable, i: int) -> Critic:
        device = t.policy.model.device
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.cfg.seed, seeds.CRITIC_INIT, i))
            net = ValueNet(t.policy.tokenizer.vocab_size).to(device)
        opt = adam(net.parameters(), self.cfg)
        return Critic(name, net, opt, agents, t.policy.tokenizer, device,
                      central=self.cfg.critic == "central")

    def inputs(self, c: Critic, batch: EpisodeBatch) -> CriticInputs:
        slots = batch.slots(c.agents).tolist()
        rows = [(b, k) for b in range(len(batch.records)) for k in slots
                if bool(batch.mask[b, k].any())]
        contexts = [c.tokenizer.encode_prompt(joint_observation(batch, b, k)) if c.central
                    else list(batch.prompt_ids[b][k]) for b, k in rows]
        completions = [batch.tokens[b, k][batch.mask[b, k]].tolist() for b, k in rows]
        return CriticInputs(rows, contexts, completions)

    @torch.no_grad()
    def values(self, c: Critic, x: CriticInputs) -> torch.Tensor:
        """``(S, n)`` current values of ``x``'s completion tokens, on the CPU."""
        return predict(c.net, x.contexts, x.completions, c.tokenizer.pad_id, c.device).cpu()

    def advantages(self, batch: EpisodeBatch,
                   inputs: list[CriticInputs]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Normalised advantages ``(B, K, L)`` and each critic's value targets ``(S, n)``."""
        adv_all = torch.zeros(batch.tokens.shape)
        returns = []
        for c, x in zip(self.critics, inputs, strict=True):
            if not x.rows:
                returns.append(torch.zeros(0, 0))
                continue
            v = self.values(c, x)  # (S, n)
            lengths = torch.tensor([len(y) for y in x.completions])
            mask = torch.arange(v.shape[1]) < lengths[:, None]
            r = torch.zeros_like(v)
            bi = torch.tensor([b for b, _ in x.rows])
            ki = torch.tensor([k for _, k in x.rows])
            r[torch.arange(len(x.rows)), lengths - 1] = batch.agent_return[
                bi, batch.call_agent[ki]].float()
            adv, ret = gae(r, v, mask, self.cfg.gamma, self.cfg.lam)
            adv_all[bi, ki, : v.shape[1]] = adv
            returns.append(ret)
        for t in self.trainables:  # normalise over each policy's valid tokens
            slots = batch.slots(t.agents)
            m = batch.mask[:, slots]
            a = adv_all[:, slots]
            if m.any():
                mean, std = a[m].mean(), a[m].std(unbiased=False)
                adv_all[:, slots] = torch.where(m, (a - mean) / (std + 1e-8), 0.0)
        return adv_all, returns

    def fit(self, c: Critic, x: CriticInputs, returns: torch.Tensor, seed: int) -> dict:
        """``epochs`` passes of ``minibatches`` value-regression steps towards ``returns``."""
        cfg, n_rows = self.cfg, len(x.rows)
        stats = {"value_loss": 0.0, "value_grad_norm": 0.0, "value_skipped": 0.0}
        gen = torch.Generator().manual_seed(seed)
        steps = 0
        size = -(-n_rows // cfg.minibatches)
        for _ in range(cfg.epochs):
            order = torch.randperm(n_rows, generator=gen).tolist()
            for start in range(0, n_rows, size):
                idx = order[start : start + size]
                comp = [x.completions[i] for i in idx]
                v = predict(c.net, [x.contexts[i] for i in idx], comp, c.tokenizer.pad_id,
                            c.device)
                ret = returns[idx, : v.shape[1]].to(c.device)
                m = (torch.arange(v.shape[1], device=c.device)
                     < torch.tensor([len(y) for y in comp], device=c.device)[:, None]).float()
                loss = cfg.value_coef * 0.5 * (((v - ret) ** 2) * m).sum() / m.sum()
                step = self._critic_step(c, loss)
                stats["value_loss"] += float(loss.detach())
                stats["value_grad_norm"] += step["grad_norm"]
                stats["value_skipped"] += step["skipped"]
                steps += 1
        return {k: (v if k == "value_skipped" else v / max(steps, 1)) for k, v in stats.items()}

    def _critic_step(self, c: Critic, loss: torch.Tensor) -> dict:
        """A guarded optimizer step for a critic (skips non-finite losses/gradients)."""
        return optimizer_step(c.optimizer, list(c.net.parameters()), loss,
                              self.cfg.max_grad_norm)

    def update(self, batch: EpisodeBatch, seed: int,
               learning: set[str] | None = None) -> dict[str, float]:
        """One PPO update. ``loss`` is the policies' loss plus the value loss; ``skipped``
        counts skipped policy and critic steps (each averaged over policies / critics)."""
        inputs = [self.inputs(c, batch) for c in self.critics]
        adv, returns = self.advantages(batch, inputs)
        stats: dict[str, float] = {}
        oracle = (oracle_episodes(self.team, self.policies, self.cfg.demo_episodes, seed)
                  if self.cfg.demo_episodes and self.sft_coef > 0 else None)
        stats.update(rollout_cost("demo", oracle.rows if oracle is not None else []))
        stats.update(policy_updates(self.trainables, self.team, batch, adv, self.cfg,
                                    self.sft_coef, oracle, seed, learning))
        for i, (c, x, ret) in enumerate(zip(self.critics, inputs, returns, strict=True)):
            if not x.rows:
                continue
            fitted = self.fit(c, x, ret, derive_seed(seed, seeds.CRITIC_SHUFFLE, i))
            for k, v in fitted.items():
                stats[k] = stats.get(k, 0.0) + v / len(self.critics)
        stats["loss"] = stats.get("loss", 0.0) + stats.get("value_loss", 0.0)
        stats["skipped"] = stats.get("skipped", 0.0) + stats.get("value_skipped", 0.0)
        stats["sft_coef"] = self.sft_coef
        self.sft_coef *= self.cfg.sft_decay
        return stats

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [t.optimizer for t in self.trainables] + [c.optimizer for c in self.critics]

    def state_dict(self) -> dict:
        return {"sft_coef": self.sft_coef,
                "optimizers": {t.name: t.optimizer.state_dict() for t in self.trainables},
                "critics": {c.name: {"net": c.net.state_dict(),
                                     "optimizer": c.optimizer.state_dict()}
                            for c in self.critics}}

    def load_state_dict(self, state: dict) -> None:
        self.sft_coef = state["sft_coef"]
        for t in self.trainables:
            t.optimizer.load_state_dict(state["optimizers"][t.name])
        for c in self.critics:
            c.net.load_state_dict(state["critics"][c.name]["net"])
            c.optimizer.load_state_dict(state["critics"][c.name]["optimizer"])
