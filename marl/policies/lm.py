"""Language-model policies: any :class:`~marl.policies.generation.CausalLM` plus its tokenizer.

``generate`` samples a batch of completions (token ids, per-token log-probs, text cut at
the first stop string); ``score`` recomputes those log-probs under the current parameters,
with gradients, for training.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import torch

from marl.errors import MarlError
from marl.policies.base import Completion, Policy, Request
from marl.policies.generation import (
    CausalLM,
    Generated,
    Sampling,
    completion_text,
    generate,
    score,
)
from marl.policies.kv_reuse import KVStore
from marl.tokenizer import Tokenizer


class LMTokenizer(Tokenizer, Protocol):
    pad_id: int
    eos_id: int | None

    def encode_prompt(self, observation: str) -> list[int]: ...


class LMPolicy(Policy):
    """A trainable policy. ``parameters()`` are what an optimizer updates.

    Inside :meth:`rollout` (and only there) a call reuses the KV cache of the policy's
    earlier calls for the prompt prefix they share, unless ``reuse_cache`` is False;
    ``prefill_tokens`` and ``reused_tokens`` count, over all calls, the positions the
    model ran before sampling and the prompt tokens taken from a stored cache instead.
    """

    def __init__(self, model: CausalLM, tokenizer: LMTokenizer, sampling: Sampling,
                 seed: int = 0, module: torch.nn.Module | None = None,
                 saver: Callable[[Path], Path] | None = None, reuse_cache: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.module = module
        self.saver = saver
        self.generator = torch.Generator(device=model.device).manual_seed(seed)
        self.reuse_cache = reuse_cache
        self.prefill_tokens = 0
        self.reused_tokens = 0
        self._store: KVStore | None = None

    def reseed(self, seed: int) -> None:
        # Stored K/V do not depend on the sampling randomness: the store stays.
        self.generator.manual_seed(seed)

    @contextmanager
    def rollout(self, calls_per_round: int) -> Iterator[None]:
        outer = self._store
        self._store = KVStore(calls_per_round, self._version()) if self.reuse_cache else None
        try:
            yield
        finally:
            self._store = outer  # the caches are released here

    def _version(self) -> int:
        """Changes whenever a trained parameter is modified in place (an optimizer step, a
        load); a policy without ``module`` relies on :meth:`rollout`'s scope alone."""
        return sum(p._version for p in self.parameters())

    def parameters(self) -> list[torch.nn.Parameter]:
        """What an optimizer updates: the model's trained parameters (a LoRA adapter's
        only, on a shared base)."""
        return self.model.weights() if self.module else []

    def prompt_ids(self, requests: Sequence[Request]) -> list[list[int]]:
        return [self.tokenizer.encode_prompt(r.observation) for r in requests]

    def generate(self, requests: Sequence[Request], greedy: bool = False) -> list[Completion]:
        if not requests:
            return []
        s = self.sampling
        if greedy:
            s = replace(s, temperature=0.0)
        prompts = self.prompt_ids(requests)
        if self._store is not None:
            self._store.sync(self._version())
        out = generate(self.model, prompts, s, pad_id=self.tokenizer.pad_id,
                       eos_id=self.tokenizer.eos_id, decode=self.tokenizer.decode,
                       generator=self.generator, store=self._store)
        self.prefill_tokens += out.prefilled
        self.reused_tokens += out.reused
        return self.completions(prompts, out, s)

    def completions(self, prompts: Sequence[Sequence[int]], out: Generated,
                    s: Sampling) -> list[Completion]:
        """The completions of a generated batch: ids, log-probs, and text cut at a stop."""
        tokens, logprobs, mask = out.tokens.cpu(), out.logprobs.cpu(), out.mask.cpu()
        completions = []
        for i in range(len(prompts)):
            ids = tokens[i][mask[i]].tolist()
            text = completion_text(ids, self.tokenizer.decode, s.stop)
            completions.append(Completion(text, tuple(ids), tuple(logprobs[i][mask[i]].tolist()),
                                          out.finish[i], tuple(prompts[i])))
        return completions

    def score(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
              entropy: bool = False, reference: CausalLM | None = None,
              support: torch.Tensor | None = None, lump_support: bool | torch.Tensor = False
              ) -> tuple[torch.Tensor, ...]:
        """Log-probs ``(B, L)`` and mask of ``completions`` after ``prompts`` (with grad),
        plus per-token entropies when ``entropy``, KL to ``reference`` (``lump_support``:
        with each position's support as one outcome, in every row or the masked ones) and
        the log-probs of ``support`` tokens when given (see
        :func:`marl.policies.generation.score`)."""
        return score(self.model, prompts, completions, pad_id=self.tokenizer.pad_id,
                     temperature=self.sampling.temperature, entropy=entropy,
                     reference=reference, support=support, lump_support=lump_support)

    def save(self, path: Path) -> Path:
        """Write the weights where ``--checkpoint`` / ``path:`` can load them."""
        if self.saver is None:
            raise MarlError("this policy has no saver; build it through build_policy.")
        return self.saver(Path(path))
