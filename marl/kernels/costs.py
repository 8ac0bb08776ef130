"""Batched token cost and token-penalised reward.

``cost[e, n] = Σ_r (prompt − cached)·p_in[n] + cached·p_cache[n] + completion·p_out[n]``,
prices per *single* token in USD as in LiteLLM's table (``input_cost_per_token``,
``cache_read_input_token_cost``, ``output_cost_per_token``).

This is the batched float form used inside training (float64 by default: exact to the cent for
any realistic ledger, since token totals below 2^53 are exact and each product is rounded once).
The exact ``Decimal`` ledger that bills a run lives at the environment boundary
(:mod:`marl.cost.ledger`), and so does the scalar twin of the reward,
:func:`marl.cost.ledger.token_penalty`; tests hold the two forms equal on played batches.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class TokenCosts(NamedTuple):
    """Outputs of :func:`token_costs`."""

    per_agent: Tensor
    """``[E, N]`` cost of each agent over all rounds of each episode."""
    per_episode: Tensor
    """``[E]`` cost of each episode (sum over agents)."""
    tokens: Tensor
    """``[E]`` prompt + completion tokens of each episode (what the penalty counts)."""
    reward: Tensor | None
    """``[E]`` ``score − penalty_per_1k · tokens / 1000``, or None without a score."""
    agent_penalty: Tensor
    """``[E, N]`` ``penalty_per_1k · tokens / 1000`` of each agent's own tokens (GRPO's
    per-agent cost); summed over agents it is the episode's penalty."""


def _check_tokens(prompt: Tensor, cached: Tensor, completion: Tensor) -> None:
    if prompt.dim() != 3 or cached.shape != prompt.shape or completion.shape != prompt.shape:
        raise ValueError(
            f"token_costs expects prompt, cached, completion of one shape [E, R, N]; got "
            f"{tuple(prompt.shape)}, {tuple(cached.shape)}, {tuple(completion.shape)}"
        )
    bad = (prompt < 0) | (cached < 0) | (completion < 0) | (cached > prompt)
    if prompt.is_floating_point() or completion.is_floating_point() or cached.is_floating_point():
        bad = bad | ~(prompt.isfinite() & cached.isfinite() & completion.isfinite())
    if bool(bad.any()):  # one sync; a wrong bill is worse than a slow one
        e, r, n = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"token_costs: bad token counts at episode {e}, round {r}, agent {n}: "
            f"prompt={prompt[e, r, n].item()}, cached={cached[e, r, n].item()}, "
            f"completion={completion[e, r, n].item()}. Counts must be finite and ≥ 0, and "
            f"cached tokens are part of the prompt (cached ≤ prompt)."
        )


def _price_table(prices: Tensor | tuple[float, float, float], n: int, dtype, device) -> Tensor:
    p = torch.as_tensor(prices, dtype=dtype, device=device)
    if p.shape == (3,):
        p = p.expand(n, 3)
    if p.shape != (n, 3):
        raise ValueError(
            f"prices must be a 3-tuple (input, cache_read, output) or a tensor [N={n}, 3]; "
            f"got shape {tuple(p.shape)}"
        )
    if not bool((p.isfinite() & (p >= 0)).all()):
        raise ValueError(f"prices must be finite and ≥ 0 USD per token; got {p.tolist()}")
    return p


def token_costs(
    prompt: Tensor,
    cached: Tensor,
    completion: Tensor,
    prices: Tensor | tuple[float, float, float],
    penalty_per_1k: float = 0.0,
    score: Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> TokenCosts:
    """Per-agent and per-episode USD cost, and the token-penalised reward.

    Args:
        prompt: ``[E, R, N]`` prompt tokens per episode, round and agent (cached included).
        cached: ``[E, R, N]`` prompt tokens read from the provider's cache.
        completion: ``[E, R, N]`` completion tokens (reasoning tokens included).
        prices: ``(input, cache_read, output)`` USD per token for every agent, or ``[N, 3]``.
        penalty_per_1k: reward penalty per 1000 prompt + completion tokens.
        score: optional ``[E]`` task score to penalise.
        dtype: money dtype (float64; differentiable in prices, score and float token counts).

    Raises ValueError on negative or non-finite counts, ``cached > prompt``, or bad prices.
    A NaN score stays NaN in ``reward``.

    >>> t = torch.tensor([[[1000, 2000]]])  # one episode, one round, two agents
    >>> c = token_costs(t, torch.zeros_like(t), t, (1e-6, 0.0, 4e-6), 0.1, torch.tensor([1.0]))
    >>> c.per_agent
    tensor([[0.0050, 0.0100]], dtype=torch.float64)
    >>> c.reward  # 1 − 0.1 · 6000 / 1000
    tensor([0.4000], dtype=torch.float64)
    """
    _check_tokens(prompt, cached, completion)
    p = _price_table(prices, prompt.shape[2], dtype, prompt.device)  # [N, 3]
    # Sum rounds first, in the counts' own dtype: integer totals stay exact.
    pt, ct, ot = (x.sum(1).to(dtype) for x in (prompt, cached, completion))  # [E, N] each
    per_agent = (pt - ct) * p[:, 0] + ct * p[:, 1] + ot * p[:, 2]
    tokens = (pt + ot).sum(1)
    reward = None
    if score is not None:
        if score.shape != tokens.shape:
            raise ValueError(f"score must be [E={tokens.shape[0]}]; got {tuple(score.shape)}")
        reward = score.to(dtype) - penalty_per_1k * tokens / 1000
    return TokenCosts(per_agent, per_agent.sum(1), tokens, reward,
                      penalty_per_1k * (pt + ot) / 1000)
