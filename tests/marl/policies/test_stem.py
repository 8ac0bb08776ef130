"""Prompts that share a long stem (a listener's G prompts differ only in the message it
read) run the stem once, when sampling and when scoring: same results, fewer positions."""

import random

import pytest
import torch

from marl.policies import generation
from marl.policies.generation import Sampling, generate, score
from marl.policies.kv_reuse import KVStore, Stored, stem_groups, stem_length
from tests.marl.policies.conftest import BACKENDS, backend_lm

pytestmark = pytest.mark.usefixtures("one_thread")


def make(backend: str, request: pytest.FixtureRequest):
    """The CausalLM, its trainable module and its pad id."""
    lm, module, tok = backend_lm(backend, request)
    return lm, module, tok.pad_id


def listener_prompts(rows: int = 12, seed: int = 0) -> list[tuple[int, ...]]:
    """A 40-token stem, then a "message" of 1-6 tokens and a common tail; two repeats."""
    rng = random.Random(seed)
    stem = tuple(rng.randrange(3, 90) for _ in range(40))
    tail = tuple(rng.randrange(3, 90) for _ in range(5))
    prompts = [stem + tuple(rng.randrange(3, 90) for _ in range(rng.randint(1, 6))) + tail
               for _ in range(rows - 2)]
    return prompts + prompts[:2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_sampling_after_a_shared_stem_gives_the_same_rollout(backend, request, monkeypatch):
    model, _, pad = make(backend, request)
    prompts = listener_prompts()

    def run():
        gen = torch.Generator().manual_seed(3)
        return generate(model, prompts, Sampling(max_new_tokens=6, stop=()), pad_id=pad,
                        eos_id=None, decode=lambda ids: "", generator=gen)

    shared = run()
    monkeypatch.setattr(generation, "stem_length", lambda prompts: 0)
    alone = run()
    assert torch.equal(shared.tokens, alone.tokens)
    torch.testing.assert_close(shared.logprobs, alone.logprobs, atol=1e-5, rtol=0)
    # 10 distinct prompts of up to 51 tokens each, against the stem once and every rest
    assert alone.prefilled == 10 * max(map(len, prompts))
    assert shared.prefilled < alone.prefilled / 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_scoring_after_a_shared_stem_equals_scoring_each_row_alone(backend, request,
                                                                   monkeypatch):
    model, module, pad = make(backend, request)
    prompts = listener_prompts()
    rng = random.Random(1)
    comps = [tuple(rng.randrange(3, 90) for _ in range(rng.randint(1, 5))) for _ in prompts]
    used = []
    after_stem = generation._logits_after_stem
    monkeypatch.setattr(generation, "_logits_after_stem",
                        lambda *a, **k: used.append(1) or after_stem(*a, **k))
    lp, mask, ent = score(model, prompts, comps, pad_id=pad, entropy=True)
    assert used, "the stem path was not taken"
    ((lp * mask).sum() + ent.sum()).backward()
    shared = [p.grad.clone() for p in module.parameters()]
    module.zero_grad()
    alone = [score(model, [p], [c], pad_id=pad, entropy=True)
             for p, c in zip(prompts, comps, strict=True)]
    sum((a * m).sum() + e.sum() for a, m, e in alone).backward()
    for i, (a, _, e) in enumerate(alone):
        torch.testing.assert_close(lp[i, : len(comps[i])], a[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(ent[i, : len(comps[i])], e[0], atol=1e-5, rtol=0)
        assert mask[i].sum() == len(comps[i])
    for g, p in zip(shared, module.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-4)


def test_stem_length_counts_only_what_pays():
    prompts = listener_prompts()
    assert stem_length(prompts) == 40
    assert stem_length(prompts[:1]) == 0  # one prompt: nothing to share
    assert stem_length([p[35:] for p in prompts]) == 0  # a 5-token stem is not worth it
    # At least the last token of every prompt runs (its logits start sampling).
    assert stem_length([(1, 2, 3), (1, 2, 3)], ratio=1.0) == 2


def test_one_stored_row_is_taken_as_the_same_columns_as_from_many():
    """A stem (one stored row) is copied by broadcasting; the general path gathers. Both
    place every row's reused tokens right-aligned, after zeros."""
    torch.manual_seed(0)
    prompts = listener_prompts()
    stem = prompts[0][:40]
    kv = torch.randn(1, 2, 40, 4)
    one = KVStore(keep=1, version=0)
    one.add(Stored(kv, [stem], [0]))
    many = KVStore(keep=1, version=0)  # the same row twice: the gathering path
    many.add(Stored(torch.cat([kv, kv]), [stem, stem], [0, 0]))
    outs = []
    for store in (one, many):
        reuse, suffix = store.plan(prompts, torch.device("cpu"))
        outs.append(reuse.take([store.calls[0].cache], torch.zeros(len(prompts), 2,
                                                                   reuse.width + 3, 4)))
        assert suffix == max(map(len, prompts)) - 40
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)
    j = min(range(len(prompts)), key=lambda i: len(prompts[i]))
    short = len(prompts[j]) - suffix  # a shorter prompt reuses fewer of the stem's tokens
    assert short < 40 and torch.equal(outs[0][j, :, 40 - short : 40], kv[0, :, :short])
    assert not outs[0][j, :, : 40 - short].any()


def agent_prompts(agents: int = 3, rows: int = 4, seed: int = 0) -> list[tuple[int, ...]]:
    """A shared policy's prompts: they part at the agent's name, then each agent's rows
    share a 30-token stem of their own and differ in a short message."""
    rng = random.Random(seed)
    head = tuple(rng.randrange(3, 90) for _ in range(4))
    out = []
    for a in range(agents):
        stem = tuple(rng.randrange(3, 90) for _ in range(30))
        out += [head + (90 + a,) + stem + tuple(rng.randrange(3, 90) for _ in range(3))
                for _ in range(rows)]
    return out


def test_prompts_that_part_at_the_agent_are_grouped_by_agent():
    prompts = agent_prompts()
    assert stem_length(prompts) == 0  # no stem for all of them
    assert stem_groups(prompts) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert stem_groups(prompts, most=2) == [list(range(12))]  # three groups are too many
    assert stem_groups(listener_prompts()) == [list(range(12))]  # one stem already pays


@pytest.mark.parametrize("backend", BACKENDS)
def test_scoring_group_by_group_equals_scoring_each_row_alone(backend, request):
    model, module, pad = make(backend, request)
    prompts = agent_prompts()
    rng = random.Random(2)
    comps = [tuple(rng.randrange(3, 90) for _ in range(rng.randint(1, 4))) for _ in prompts]
    comps[5] = ()  # a row with nothing to score
    lp, mask, ent = score(model, prompts, comps, pad_id=pad, entropy=True)
    ((lp * mask).sum() + ent.sum()).backward()
    grouped = [p.grad.clone() for p in module.parameters()]
    module.zero_grad()
    alone = [score(model, [p], [c or (3,)], pad_id=pad, entropy=True)
             for p, c in zip(prompts, comps, strict=True)]
    sum((a * m).sum() + e.sum() for (a, m, e), c in zip(alone, comps, strict=True)
        if c).backward()
    for i, (a, _, e) in enumerate(alone):
        n = len(comps[i])
        torch.testing.assert_close(lp[i, :n], a[0, :n], atol=1e-5, rtol=0)
        torch.testing.assert_close(ent[i, :n], e[0, :n], atol=1e-5, rtol=0)
        assert mask[i].sum() == n and not lp[i, n:].any() and not ent[i, n:].any()
    for g, p in zip(grouped, module.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-4)
