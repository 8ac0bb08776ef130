"""Pieces every algorithm shares: per-policy training samples, the clipped policy-gradient
loss with KL, entropy and SFT terms, and a guarded optimizer step.

Loss (per policy, tokens t of its agents' completions, advantage A)::

    ratio  = exp(log π(t) − log π_old(t))
    L_pg   = −min(ratio·A, clip(ratio, 1 − clip_low, 1 + clip_high)·A)      (clip-higher)
    L      = agg(L_pg) + kl_coef·agg(KL(π ‖ π_ref)) − entropy_coef·agg(H) + sft_coef·L_SFT
             − signal_entropy·(entropy of each agent's symbols, averaged over its calls)
             − mean over answer positions t of mean over s in S_t of
               min(log π̄_t(s) − log(answer_floor/|S_t|), 0)

KL and the entropy H are exact, over the whole vocabulary at each token; π_ref is the
policy RL started from (after the warm-up). S_t is the task's alphabet at token t's
position (``Task.symbols``). π̄_t is the policy's answer
distribution at position t averaged over the batch's answers with that alphabet: the
answer-floor term lifts only an answer the team (almost) never gives, whatever it read,
to ``answer_floor`` times its share ``1/|S_t|``, and is 0, with no gradient, while every
answer is given at least that often, as in a solved team whose targets are uniform.

With ``answer_feedback: full`` the term L_pg of an answer token whose alternatives were
scored is instead −log Σ_{s in S_t} π̃_t(s)·(R(s) − min R), R(s) the team's score had the
answer said s there and π̃_t the policy renormalised over S_t (:mod:`marl.algorithms.feedback`),
and the KL at an answer token with an alphabet counts S_t as one outcome: the mass the
alphabet gets and how the rest is spread, blind to which symbol (the scores say which).

With one epoch the ratio is 1 and this is MAGRPO's REINFORCE gradient −A·∇log π. ``agg`` is
the token mean (``token``) or the mean of per-sequence means (``sequence``). L_SFT is the
negative log-likelihood of the task oracle's message for the same observation, and (with
``demo_episodes``) of every message in extra episodes the oracle plays alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

from marl import seeds
from marl.algorithms.alphabets import (
    alphabet,
    answer_floor_gap,
    pad_ids,
    signal_entropy,
    support_kind,
)
from marl.algorithms.config import TrainConfig
from marl.algorithms.feedback import alternative_scores, answer_loss, kl_lumping
from marl.cost.ledger import Ledger, LedgerRow
from marl.errors import MarlError
from marl.policies.lm import LMPolicy
from marl.policies.scripted import ScriptedPolicy
from marl.rollout import EpisodeBatch, collect
from marl.seeds import derive_seed
from marl.team import Team


@dataclass
class Trainable:
    """One trainable policy: its agents, optimizer, and (for KL) a frozen reference."""

    name: str
    policy: LMPolicy
    agents: list[str]
    optimizer: torch.optim.Optimizer
    reference: object | None = None


def adam(params, cfg: TrainConfig) -> torch.optim.Adam:
    """The optimizer of every trainable model (policies and critics)."""
    return torch.optim.Adam(params, lr=cfg.lr, eps=cfg.adam_eps, betas=(0.9, cfg.adam_beta2))


def trainables(team: Team, policies: dict, cfg: TrainConfig) -> list[Trainable]:
    """The model policies of a team, one per scenario policy name."""
    out = []
    for name in team.scenario.policies:
        agents = [a.id for a in team.agents if a.policy == name]
        policy = policies[agents[0]] if agents else None
        if not isinstance(policy, LMPolicy) or not policy.parameters():
            continue
        opt = adam(policy.parameters(), cfg)
        ref = policy.model.frozen() if cfg.kl_coef > 0 else None
        out.append(Trainable(name, policy, agents, opt, ref))
    return out


def begin_rl(trainables: list[Trainable], cfg: TrainConfig,
             reference: dict[str, list[torch.Tensor]] | None = None,
             reset_optimizer: bool = True) -> None:
    """RL starts (after the warm-up): the KL term's reference becomes the current policy,
    or the given ``reference`` parameters (by policy name, in ``parameters()`` order) when
    a run resumes; the optimizers start afresh unless ``reset_optimizer`` is False."""
    for t in trainables:
        if reset_optimizer:
            t.optimizer = adam(t.policy.parameters(), cfg)
        if cfg.kl_coef <= 0:
            continue
        t.reference = t.policy.model.frozen()
        if reference is not None:
            with torch.no_grad():
                for p, q in zip(t.reference.weights(), reference[t.name], strict=True):
                    p.copy_(q)


def reference_weights(trainables: list[Trainable]) -> dict[str, list[torch.Tensor]]:
    """The KL term's frozen reference of each trainable policy, in ``parameters()`` order
    (what :func:`begin_rl` takes back; empty before RL or without a KL term)."""
    return {t.name: [p.detach().clone() for p in t.reference.weights()]
            for t in trainables if t.reference is not None}


@dataclass
class Samples:
    """A policy's completions in a batch, flattened: one row per (episode, call)."""

    prompts: list[tuple[int, ...]]
    completions: list[list[int]]
    old_logprobs: torch.Tensor  # (S, L)
    mask: torch.Tensor  # (S, L)
    advantages: torch.Tensor  # (S,) or (S, L)
    # The oracle's messages, tokenised; [] where it would only guess.
    demos: list[list[int]] = field(default_factory=list)
    # (S,): the sample's group succeeded in every rollout (nothing left to explore there).
    solved: torch.Tensor | None = None
    # (S, L', A): token ids of the task's alphabet at each position, -1 pads
    # (signal_entropy, answer_floor).
    support: torch.Tensor | None = None
    # (S,): the row is an answer (its agent's final call).
    answer: torch.Tensor | None = None
    # (S,): the row's agent (index into the batch's agents).
    agent: torch.Tensor | None = None
    # The prompt the same call had in another task instance of the batch (influence_coef).
    counter: list[tuple[int, ...]] | None = None
    # (S, L', A): the team's score with each alternative symbol of the support at each
    # answer position, NaN where none was scored (answer_feedback: full).
    alternatives: torch.Tensor | None = None


def samples_for(t: Trainable, team: Team, batch: EpisodeBatch, adv: torch.Tensor,
                with_demos: bool, oracle: EpisodeBatch | None = None,
                support: Literal["all", "answers"] | None = None,
                counter: bool = False, feedback: bool = False) -> Samples:
    """Rows of ``t``'s agents; ``adv`` is ``(B, N)`` per-agent advantages (or ``(B, K, L)``
    per-token ones). ``oracle``: episodes played by the task oracle, whose calls are added
    as demonstration-only rows (no completion, advantage 0). ``support``: with the
    alphabets (token ids, see :func:`marl.algorithms.alphabets.symbol_ids`) of every row
    or of answer rows only (see :func:`marl.algorithms.alphabets.support_kind`).
    ``counter``: with each row's prompt in another task instance (``influence_coef``).
    ``feedback``: with the scores of the answers' alternatives (``answer_feedback: full``;
    needs ``support``)."""
    slots = batch.slots(t.agents).tolist()
    rows = [(b, k) for b in range(len(batch.records)) for k in slots]
    demos = [_demo_ids(t, team, batch, b, k) for b, k in rows] if with_demos else []
    bi = torch.tensor([b for b, _ in rows])
    ki = torch.tensor([k for _, k in rows])
    mask = batch.mask[bi, ki]
    if adv.dim() == 2:
        row_adv = adv[bi, batch.call_agent[ki]]
    else:
        row_adv = adv[bi, ki]
    s = Samples(prompts=[batch.prompt_ids[b][k] for b, k in rows],
                completions=[batch.tokens[b, k][batch.mask[b, k]].tolist() for b, k in rows],
                old_logprobs=batch.logprobs[bi, ki], mask=mask, advantages=row_adv,
                demos=demos, solved=batch.group_solved[bi])
    calls = {k: _call(team, batch, k) for k in slots}
    s.answer = torch.tensor([calls[k][1] for _, k in rows], dtype=torch.bool)
    s.agent = batch.call_agent[ki]
    size = int((batch.group_ids == batch.group_ids[0]).sum())  # rollouts of one instance
    if counter and len(batch.records) > size:  # the next group's: another instance
        s.counter = [batch.prompt_ids[(b + size) % len(batch.records)][k] for b, k in rows]
    if support:
        alphabets = {call: alphabet(t, team, call, support) for call in set(calls.values())}
        s.support = pad_ids([alphabets[calls[k]] for _, k in rows])
        if feedback:
            s.alternatives = alternative_scores(team, batch, rows, s.support)
    if oracle is None or not with_demos:
        return s
    extra = [(b, k) for b in range(len(oracle.records)) for k in oracle.slots(t.agents).tolist()]
    n, width = len(extra), s.mask.shape[1]
    return Samples(
        prompts=s.prompts + [tuple(t.policy.tokenizer.encode_prompt(oracle.observations[b][k]))
                             for b, k in extra],
        completions=s.completions + [[] for _ in extra],
        old_logprobs=torch.cat([s.old_logprobs, s.old_logprobs.new_zeros(n, width)]),
        mask=torch.cat([s.mask, s.mask.new_zeros(n, width)]),
        advantages=torch.cat([s.advantages, s.advantages.new_zeros(n, *s.advantages.shape[1:])]),
        demos=s.demos + [_demo_ids(t, team, oracle, b, k) for b, k in extra],
        solved=torch.cat([s.solved, s.solved.new_zeros(n)]),
        answer=torch.cat([s.answer, s.answer.new_zeros(n)]),
        agent=torch.cat([s.agent, s.agent.new_full((n,), -1)]),
        support=None if s.support is None else torch.cat(
            [s.support, s.support.new_full((n, *s.support.shape[1:]), -1)]),
        alternatives=None if s.alternatives is None else torch.cat(
            [s.alternatives, s.alternatives.new_full((n, *s.alternatives.shape[1:]),
                                                     float("nan"))]))


def _call(team: Team, batch: EpisodeBatch, k: int) -> tuple[str, bool]:
    """The agent of call slot ``k`` and whether that call is its answer."""
    agent = batch.agents[int(batch.call_agent[k])]
    return agent, team.is_final_call(agent, int(batch.call_round[k]))


def _demo_ids(t: Trainable, team: Team, batch: EpisodeBatch, b: int, k: int) -> list[int]:
    """The oracle's message for call ``k`` of episode ``b``, tokenised with the stop string
    (or eos) the policy must learn to end with; [] where the oracle would only guess."""
    agent, final = _call(team, batch, k)
    demo = team.task.demonstration(agent, batch.observations[b][k], final)
    return [] if demo is None else target_ids(t, demo)


def target_ids(t: Trainable, text: str) -> list[int]:
    """A message as a training target for ``t``: its tokens, then the stop string (or eos)
    the policy must learn to end with, cut to ``max_new_tokens``."""
    tok = t.policy.tokenizer
    stop = t.policy.sampling.stop[0] if t.policy.sampling.stop else ""
    ids = tok.encode(text + stop)
    if not stop and tok.eos_id is not None:
        ids.append(tok.eos_id)
    return ids[: t.policy.sampling.max_new_tokens]


def rollout_cost(kind: str, rows: list[LedgerRow]) -> dict[str, float]:
    """Tokens and USD of rollouts an update made itself (``demo``: oracle-played episodes;
    ``counterfactual``: credit replays), for the iteration's metrics."""
    ledger = Ledger(rows)
    return {f"{kind}_tokens": float(ledger.total().total), f"{kind}_cost_usd": float(ledger.cost())}


def oracle_episodes(team: Team, policies: dict, episodes: int, seed: int) -> EpisodeBatch:
    """``episodes`` fresh task instances played by the task oracle for every agent (counted
    with each agent's own tokenizer), for ``demo_episodes``."""
    oracles: dict[int, ScriptedPolicy] = {}
    for a in team.ids:
        oracles.setdefault(id(policies[a]), ScriptedPolicy(team.task,
                                                           tokenizer=policies[a].tokenizer))
    return collect(team, {a: oracles[id(policies[a])] for a in team.ids}, episodes, 1,
                   seed=derive_seed(seed, seeds.DEMO))


def aggregate(x: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """Mean of ``x`` over masked tokens: over all tokens, or per sequence then over rows."""
    m = mask.float()
    if how == "token":
        return (x * m).sum() / m.sum().clamp(min=1)
    per_seq = (x * m).sum(-1) / m.sum(-1).clamp(min=1)
    return per_seq[mask.any(-1)].mean() if mask.any() else x.sum() * 0


def score_rows(t: Trainable, prompts: list, completions: list, entropy: bool = False,
               kl: bool = False, support: torch.Tensor | None = None,
               lump_support: bool | torch.Tensor = False) -> tuple[torch.Tensor, ...]:
    """:meth:`LMPolicy.score` with every distinct (prompt, completion) pair run once.

    A group's G rollouts share their first prompts, their demonstrations are equal, and a
    confident policy repeats itself, so a batch holds many duplicate rows. Their log-probs
    are gathered back row by row, so gradients sum over duplicates exactly as if each row
    had its own forward and backward pass.
    """
    keys: dict[tuple, int] = {}
    index = [keys.setdefault((tuple(p), tuple(c)), len(keys))
             for p, c in zip(prompts, completions, strict=True)]
    unique = list(keys)
    if support is not None:  # equal rows are one agent's call: their alphabets are equal
        first: dict[int, int] = {}
        for row, u in enumerate(index):
            first.setdefault(u, row)
        support = support[list(first.values())]
        if torch.is_tensor(lump_support):
            lump_support = lump_support[list(first.values())]
    out = t.policy.score([p for p, _ in unique], [list(c) for _, c in unique], entropy=entropy,
                         reference=t.reference if kl else None, support=support,
                         lump_support=lump_support)
    rows = torch.tensor(index, device=out[0].device)
    return tuple(x.index_select(0, rows) for x in out)


def pg_terms(t: Trainable, s: Samples, cfg: TrainConfig,
             scored: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, dict]:
    """The RL part of the loss for rows ``s`` (all with at least one generated token): the
    clipped policy-gradient term (``pg_loss`` in the stats), the entropy bonus, the KL term
    and the signalling and answer terms;
    ``scored``: their ``(logprobs, mask, entropy[, kl][, symbols])`` if already computed
    (``kl``: per token, to the reference, when the policy has one; ``symbols``: the
    log-prob ``(S, L, A)`` of each symbol of each token's alphabet, when ``s`` has a
    support)."""
    lp, mask, ent, *rest = scored or score_rows(t, s.prompts, s.completions, entropy=True,
                                                kl=t.reference is not None, support=s.support,
                                                lump_support=kl_lumping(cfg, s.answer))
    kl_tok = rest[:1] if t.reference is not None else []
    width = lp.shape[1]
    old = s.old_logprobs[:, :width].to(lp.device)
    adv = s.advantages[:, None] if s.advantages.dim() == 1 else s.advantages[:, :width]
    adv = adv.to(lp.device)
    ratio = (lp - old).exp()
    clipped = ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    pg = -torch.minimum(ratio * adv, clipped * adv)
    stats: dict[str, float] = {}
    if s.support is not None:
        symbols = rest[-1]
        ids = torch.full(symbols.shape, -1, dtype=torch.long, device=mask.device)
        n = min(width, s.support.shape[1])
        ids[:, :n, : s.support.shape[2]] = s.support[:, :n].to(mask.device)
        if s.alternatives is not None:  # answer_feedback: full
            told, where = answer_loss(symbols, ids, s.alternatives)
            where = where & mask
            pg = torch.where(where, told, pg)
            is_answer = s.answer.to(mask.device)
            stats["full_feedback"] = float(where.any(-1)[is_answer].float().mean()
                                           if is_answer.any() else 0.0)
    loss = aggregate(pg, mask, cfg.aggregation)
    stats.update({"pg_loss": float(loss.detach()),  # the policy-gradient term alone
                  "entropy": float(aggregate(ent.detach(), mask, "token"))})
    reg = regularized(s, mask, cfg)
    if cfg.entropy_coef:
        # With a target, only tokens whose entropy is below it are pushed up (a floor).
        bonus = ent if cfg.entropy_target is None else ent.clamp(max=cfg.entropy_target)
        loss = loss - cfg.entropy_coef * aggregate(bonus, reg, cfg.aggregation)
    if kl_tok:
        loss = loss + cfg.kl_coef * aggregate(kl_tok[0], reg, cfg.aggregation)
        stats["kl"] = float(aggregate(kl_tok[0].detach(), mask, cfg.aggregation))
    if s.support is not None:
        valid = ids >= 0
        has = mask & valid.any(-1)
        if cfg.signal_entropy > 0:
            spread = signal_entropy(symbols, ids, has, s.agent.to(mask.device))
            loss = loss - cfg.signal_entropy * spread
            stats["signal_entropy"] = float(spread.detach())
        if cfg.answer_floor > 0:
            answers = has & s.answer.to(mask.device)[:, None]
            gap, rare = answer_floor_gap(symbols, ids, answers, cfg.answer_floor)
            loss = loss - gap
            stats["rare_answers"] = rare
    if cfg.influence_coef > 0 and s.counter:
        tv = influence(t, s, cfg)
        loss = loss - cfg.influence_coef * tv
        stats["influence"] = float(tv.detach())
    stats["clip_frac"] = float(aggregate(((ratio - clipped).abs() > 0).float(), mask, "token"))
    return loss, stats


def influence(t: Trainable, s: Samples, cfg: TrainConfig) -> torch.Tensor:
    """The input-influence bonus (positive listening, Eccles et al. 2019): the mean total
    variation between each token's distribution given what the agent read and given the
    same call's observation in another task instance (``s.counter``), both teacher-forced
    on the sampled completion. It rises as an agent's output comes to depend on its input,
    which is what lets reward reach a teammate through it. Over the first ``1 / G`` of the
    rows (a minibatch's rows come shuffled), to keep its cost a fraction of a step's.
    """
    n = max(1, math.ceil(len(s.prompts) / cfg.group_size))
    comps = s.completions[:n]
    width = max(len(c) for c in comps)
    vocab = t.policy.tokenizer.vocab_size
    every = torch.arange(vocab).expand(n, width, vocab)  # the whole distribution
    _, mask, real = score_rows(t, s.prompts[:n], comps, support=every)
    _, _, other = score_rows(t, s.counter[:n], comps, support=every)
    tv = 0.5 * (real.exp() - other.exp()).abs().sum(-1)
    return aggregate(tv, mask, "token")


def regularized(s: Samples, mask: torch.Tensor, cfg: TrainConfig) -> torch.Tensor:
    """The tokens the KL and entropy terms apply to: all of them, or (``regularize_solved:
    false``, group baselines) all but those of samples whose group succeeded in every
    rollout, where no policy gradient is left and the two terms alone (scaled up by Adam)
    can move a solved team. Where every rollout failed they always apply: that is where an
    agent certain of a wrong answer must keep exploring."""
    if cfg.regularize_solved or s.solved is None or cfg.algorithm == "ppo":
        return mask  # PPO's critic gives a solved episode advantages of its own
    return mask & ~s.solved.to(mask.device)[:, None]


def sft_term(t: Trainable, prompts: list, demos: list[list[int]],
             scored: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
    """Mean negative log-likelihood of the demonstrations (``scored``: as in pg_terms)."""
    lp, mask = (scored or score_rows(t, prompts, demos))[:2]
    return -(lp * mask).sum() / mask.sum().clamp(min=1)


def optimizer_step(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter],
                   loss: torch.Tensor, max_grad_norm: float) -> dict:
    """Backward, clip and step, unless the loss or the gradient norm is not finite: then
    nothing changes and ``skipped`` is 1."""
    optimizer.zero_grad(set_to_none=True)
    if not torch.isfinite(loss):
        return {"skipped": 1, "grad_norm": float("nan")}
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    if not torch.isfinite(norm):
        optimizer.zero_grad(set_to_none=True)
        return {"skipped": 1, "grad_norm": float("nan")}
    optimizer.step()
    return {"skipped": 0, "grad_norm": float(norm)}


def guarded_step(t: Trainable, loss: torch.Tensor, cfg: TrainConfig) -> dict:
    """:func:`optimizer_step` for a policy."""
    return optimizer_step(t.optimizer, t.policy.parameters(), loss, cfg.max_grad_norm)


def update(t: Trainable, s: Samples, cfg: TrainConfig, sft_coef: float, seed: int) -> dict:
    """``cfg.epochs`` passes of ``cfg.minibatches`` clipped policy-gradient steps, in an
    order shuffled with ``seed``."""
    rows = [i for i in range(len(s.prompts))
            if s.completions[i] or (sft_coef > 0 and s.demos and s.demos[i])]
    stats: dict[str, float] = {}
    n_steps = 0
    gen = torch.Generator().manual_seed(seed)
    for _ in range(cfg.epochs):
        order = [rows[i] for i in torch.randperm(len(rows), generator=gen).tolist()]
        size = math.ceil(len(order) / cfg.minibatches) if order else 0
        for start in range(0, len(order), max(size, 1)):
            idx = order[start : start + size]
            loss, step_stats = _minibatch_loss(t, s, idx, cfg, sft_coef)
            step_stats.update(guarded_step(t, loss, cfg))
            for k, v in step_stats.items():
                stats[k] = stats.get(k, 0.0) + v
            n_steps += 1
    out = {k: v / max(n_steps, 1) for k, v in stats.items()}
    out["skipped"] = stats.get("skipped", 0.0)
    return out


def policy_updates(trainables: list[Trainable], team: Team, batch: EpisodeBatch,
                   adv: torch.Tensor, cfg: TrainConfig, sft_coef: float,
                   oracle: EpisodeBatch | None, seed: int,
                   learning: set[str] | None = None) -> dict[str, float]:
    """:func:`update` of every policy named in ``learning`` (None: all) on its agents'
    calls of ``batch``; the stats averaged over those policies."""
    turn = [(j, t) for j, t in enumerate(trainables) if learning is None or t.name in learning]
    stats: dict[str, float] = {}
    for j, t in turn:
        s = samples_for(t, team, batch, adv, sft_coef > 0, oracle, support=support_kind(cfg),
                        counter=cfg.influence_coef > 0,
                        feedback=cfg.answer_feedback == "full")
        for k, v in update(t, s, cfg, sft_coef, derive_seed(seed, seeds.SHUFFLE, j)).items():
            stats[k] = stats.get(k, 0.0) + v / len(turn)
    return stats


def turn_order(trainables: list[Trainable], cfg: TrainConfig) -> list[str]:
    """The policies in the order they take turns (``cfg.turns``): ``cfg.turn_order``, or
    the scenario's from last to first. Raises a :class:`MarlError` naming the policies
    when the order does not name each trainable policy once, or there is only one."""
    names = [t.name for t in trainables]
    if len(names) < 2:
        raise MarlError(f"turns: {cfg.turns} lets the policies learn one at a time, and this "
                        f"team trains one policy ({', '.join(names)}). Drop turns, or give "
                        "the agents policies of their own in the scenario.")
    order = list(cfg.turn_order) or names[::-1]
    if sorted(order) != sorted(names):
        raise MarlError(f"turn_order {order} must name every trainable policy once; this "
                        f"team's are {', '.join(names)}.")
    return order


def _minibatch_loss(t: Trainable, s: Samples, idx: list[int], cfg: TrainConfig,
                    sft_coef: float) -> tuple[torch.Tensor, dict]:
    gen_rows = [i for i in idx if s.completions[i]]
    demo_rows = [i for i in idx if sft_coef > 0 and s.demos and s.demos[i]]
    loss = torch.zeros((), device=t.policy.model.device)
    stats: dict[str, float] = {}
    # One forward pass for the sampled completions and the demonstrations together.
    prompts = [s.prompts[i] for i in gen_rows + demo_rows]
    targets = [s.completions[i] for i in gen_rows] + [s.demos[i] for i in demo_rows]
    support = None
    if s.support is not None:
        support = torch.cat([s.support[gen_rows],
                             s.support.new_full((len(demo_rows), *s.support.shape[1:]), -1)])
    lump = kl_lumping(cfg, s.answer)
    if torch.is_tensor(lump):
        lump = torch.cat([lump[gen_rows], lump.new_zeros(len(demo_rows))])
    scored = score_rows(t, prompts, targets, entropy=True, kl=t.reference is not None,
                        support=support, lump_support=lump)
    lp, mask = scored[:2]
    g = len(gen_rows)
    if gen_rows:
        sub = Samples(prompts[:g], targets[:g], s.old_logprobs[gen_rows], s.mask[gen_rows],
                      s.advantages[gen_rows],
                      solved=s.solved[gen_rows] if s.solved is not None else None,
                      support=s.support[gen_rows] if s.support is not None else None,
                      answer=s.answer[gen_rows] if s.answer is not None else None,
                      agent=s.agent[gen_rows] if s.agent is not None else None,
                      counter=[s.counter[i] for i in gen_rows] if s.counter else None,
                      alternatives=(s.alternatives[gen_rows] if s.alternatives is not None
                                    else None))
        width = int(mask[:g].sum(-1).max())
        loss, stats = pg_terms(t, sub, cfg, tuple(x[:g, :width] for x in scored))
    if demo_rows:
        sft = sft_term(t, prompts[g:], targets[g:], (lp[g:], mask[g:]))
        loss = loss + sft_coef * sft
        stats["sft_loss"] = float(sft.detach())
    stats["loss"] = float(loss.detach())
    return loss, stats
