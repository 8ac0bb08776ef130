"""Plain-loop references for every kernel: Python lists and floats, one row at a time.

Slow on purpose and written straight from the equations, so tests can trust them. They compute
in float64 and return tensors in the dtype the fast kernel returns; they implement the same
documented NaN/inf policies explicitly.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch import Tensor

NAN = math.nan


def _out(values: list, like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    return torch.tensor(values, dtype=torch.float64).to(dtype or like.dtype)


def group_advantages_ref(
    rewards: Tensor, group_ids: Tensor, baseline: str = "mean", eps: float = 1e-4
) -> Tensor:
    r, g = rewards.double().tolist(), group_ids.tolist()
    members = defaultdict(list)
    for j, k in enumerate(g):
        members[k].append(j)
    out = [0.0] * len(r)
    for rows in members.values():
        vals = [r[j] for j in rows]
        n, total = len(vals), sum(vals)
        if not math.isfinite(total):
            for j in rows:
                out[j] = NAN
            continue
        if n == 1:
            continue
        mean = total / n
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
        top = max(vals)
        for j in rows:
            if baseline == "mean":
                out[j] = r[j] - mean
            elif baseline == "mean_std":
                out[j] = (r[j] - mean) / (std + eps)
            elif baseline == "loo":
                out[j] = (n * r[j] - total) / (n - 1)
            else:
                out[j] = r[j] - top
    return _out(out, rewards)


def anchor_advantages_ref(returns: Tensor, state_ids: Tensor, action_ids: Tensor,
                          scale: bool = False, eps: float = 1e-4) -> Tensor:
    r, states, actions = returns.double().tolist(), state_ids.tolist(), action_ids.tolist()
    by_state, by_action = defaultdict(list), defaultdict(list)
    for j, (s, a) in enumerate(zip(states, actions, strict=True)):
        by_state[s].append(r[j])
        by_action[a].append(r[j])
    out = []
    for s, a in zip(states, actions, strict=True):
        v_vals, q_vals = by_state[s], by_action[a]
        v, q = sum(v_vals) / len(v_vals), sum(q_vals) / len(q_vals)
        if not (math.isfinite(v) and math.isfinite(q)):
            out.append(NAN)
            continue
        adv = q - v
        if scale:
            n = len(v_vals)
            std = math.sqrt(sum((x - v) ** 2 for x in v_vals) / (n - 1)) if n > 1 else 0.0
            adv /= std + eps
        out.append(adv)
    return _out(out, returns)


def agent_scale_ref(returns: Tensor) -> Tensor:
    out = []
    for col in returns.double().T.tolist():
        mean = sum(col) / len(col)
        std = math.sqrt(sum((x - mean) ** 2 for x in col) / len(col))
        out.append(1.0 if std == 0 else std)
    return _out(out, returns)


def group_key_ref(instance: Tensor, agent: Tensor | None = None, turn: Tensor | None = None):
    cols = [k.tolist() for k in (instance, agent, turn) if k is not None]
    keys = list(zip(*cols, strict=True))
    dense = {k: i for i, k in enumerate(sorted(set(keys)))}
    return torch.tensor([dense[k] for k in keys], dtype=torch.int64)


def tree_returns_ref(rewards: Tensor, parents: Tensor, gamma: float = 1.0) -> Tensor:
    r, par = rewards.double().tolist(), parents.tolist()
    children = defaultdict(list)
    depth = []
    for i, p in enumerate(par):
        if p >= 0:
            children[p].append(i)
        d, node = 0, i
        while par[node] >= 0:
            node, d = par[node], d + 1
            if d > len(par):
                raise ValueError("parents contain a cycle")
        depth.append(d)
    ret = list(r)
    for i in sorted(range(len(r)), key=lambda i: -depth[i]):
        kids = children[i]
        if kids:
            ret[i] = r[i] + gamma * sum(ret[c] for c in kids) / len(kids)
    return _out(ret, rewards)


def _masked_rtg(x: list, valid: list, c: float) -> list:
    """Discounted reward-to-go over valid positions; non-finite input poisons the row."""
    out, acc = [0.0] * len(x), 0.0
    if not all(math.isfinite(v) for v, m in zip(x, valid, strict=True) if m):
        return [NAN if m else 0.0 for m in valid]
    for t in reversed(range(len(x))):
        if valid[t]:
            acc = x[t] + c * acc
            out[t] = acc
    return out


def gae_ref(rewards, values, masks, gamma=1.0, lam=0.95, last_value=None):
    r, v, m = rewards.double().tolist(), values.double().tolist(), masks.bool().tolist()
    boot = [0.0] * len(r) if last_value is None else last_value.double().tolist()
    advs, rets = [], []
    for b in range(len(r)):
        row_ok = math.isfinite(boot[b]) and all(
            math.isfinite(r[b][t]) and math.isfinite(v[b][t]) for t in range(len(r[b])) if m[b][t]
        )
        adv, ret = [0.0] * len(r[b]), [0.0] * len(r[b])
        next_v, next_a = boot[b], 0.0
        for t in reversed(range(len(r[b]))):
            if not m[b][t]:
                continue
            delta = r[b][t] + gamma * next_v - v[b][t]
            next_a = delta + gamma * lam * next_a
            next_v = v[b][t]
            adv[t], ret[t] = (next_a, next_a + v[b][t]) if row_ok else (NAN, NAN)
        advs.append(adv)
        rets.append(ret)
    return _out(advs, rewards), _out(rets, rewards)


def gigpo_step_advantages_ref(
    rewards, mask, obs_hash, episode_group, episode_adv, gamma=0.95, omega=1.0
):
    r, m, h = rewards.double().tolist(), mask.bool().tolist(), obs_hash.tolist()
    g, a_ep = episode_group.tolist(), episode_adv.double().tolist()
    rtg = [_masked_rtg(r[e], m[e], gamma) for e in range(len(r))]
    steps = defaultdict(list)
    for e in range(len(r)):
        for t in range(len(r[e])):
            if m[e][t]:
                steps[(g[e], h[e][t])].append((e, t))
    out = [[0.0] * len(row) for row in r]
    for members in steps.values():
        vals = [rtg[e][t] for e, t in members]
        mean = sum(vals) / len(vals)
        for e, t in members:
            a_step = rtg[e][t] - mean if math.isfinite(mean) else NAN
            out[e][t] = a_ep[e] + omega * a_step
    return _out(out, rewards)


def shapley_exact_ref(coalition_values: Tensor) -> Tensor:
    table = coalition_values.double().tolist()
    n = len(table[0]).bit_length() - 1
    out = []
    for v in table:
        phi = [0.0] * n
        for i in range(n):
            for s in range(2**n):
                if s >> i & 1:
                    continue
                size = bin(s).count("1")
                w = math.factorial(size) * math.factorial(n - size - 1) / math.factorial(n)
                phi[i] += w * (v[s | 1 << i] - v[s])
        out.append(phi)
    return _out(out, coalition_values)


def difference_rewards_ref(full: Tensor, without: Tensor) -> Tensor:
    f, w = full.double().tolist(), without.double().tolist()
    return _out([[f[b] - x for x in w[b]] for b in range(len(f))], without)


def token_costs_ref(prompt, cached, completion, prices, penalty_per_1k=0.0, score=None):
    p, c, o = prompt.tolist(), cached.tolist(), completion.tolist()
    e_n, r_n, a_n = prompt.shape
    price = torch.as_tensor(prices, dtype=torch.float64).expand(a_n, 3).tolist()
    per_agent, tokens = [[0.0] * a_n for _ in range(e_n)], [0.0] * e_n
    own = [[0.0] * a_n for _ in range(e_n)]
    for e in range(e_n):
        for r in range(r_n):
            for n in range(a_n):
                fresh = p[e][r][n] - c[e][r][n]
                per_agent[e][n] += (
                    fresh * price[n][0] + c[e][r][n] * price[n][1] + o[e][r][n] * price[n][2]
                )
                tokens[e] += p[e][r][n] + o[e][r][n]
                own[e][n] += p[e][r][n] + o[e][r][n]
    per_episode = [sum(row) for row in per_agent]
    reward = None
    if score is not None:
        pairs = zip(score.double().tolist(), tokens, strict=True)
        reward = [s - penalty_per_1k * t / 1000 for s, t in pairs]
    f64 = torch.float64
    return (
        torch.tensor(per_agent, dtype=f64),
        torch.tensor(per_episode, dtype=f64),
        torch.tensor(tokens, dtype=f64),
        None if reward is None else torch.tensor(reward, dtype=f64),
        torch.tensor([[penalty_per_1k * t / 1000 for t in row] for row in own], dtype=f64),
    )


def broadcast_to_tokens_ref(adv: Tensor, agent_mask: Tensor) -> Tensor:
    a, m = adv.double().tolist(), (agent_mask != 0).tolist()
    out = []
    for b in range(len(m)):
        out.append([sum(a[b][n] for n in range(len(a[b])) if tok[n]) for tok in m[b]])
    return _out(out, adv)
