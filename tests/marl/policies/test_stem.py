"""Prompts that share a long stem (a listener's G prompts differ only in the message it
read) run the stem once, when sampling and when scoring, and scoring runs each prefix that
several prompts share once (a tree of prefixes): same results, fewer positions."""

import random

import pytest
import torch

from marl.policies import generation
from marl.policies.generation import Sampling, generate, prefix_tree, score
from marl.policies.kv_reuse import (
    LEVEL_COST,
    KVStore,
    Stored,
    prefix_levels,
    stem_groups,
    stem_length,
)
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
    cuts = []
    tree = generation._logits_tree
    monkeypatch.setattr(generation, "_logits_tree",
                        lambda *a, **k: cuts.append(a[3]) or tree(*a, **k))
    assert_scored_as_alone(model, module, pad, prompts, comps)
    assert cuts == [[40, max(map(len, prompts))]], "the stem did not run once"


def assert_scored_as_alone(model, module, pad: int, prompts: list, comps: list) -> None:
    """Scoring ``prompts`` and ``comps`` together gives each row's log-probs, entropies and
    gradients as scoring it alone does (an empty completion: nothing to score)."""
    lp, mask, ent = score(model, prompts, comps, pad_id=pad, entropy=True)
    ((lp * mask).sum() + ent.sum()).backward()
    together = [p.grad.clone() for p in module.parameters()]
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
    for g, p in zip(together, module.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-4)


def tree_prompts(seed: int = 0) -> list[tuple[int, ...]]:
    """Three levels of sharing, as a listener's prompts in a batch have: an 80-token stem,
    three task instances of 24 tokens each, and per instance four rows that differ in a
    two-token message before a common 3-token tail (one row repeated)."""
    rng = random.Random(seed)
    draw = lambda n: tuple(rng.randrange(3, 90) for _ in range(n))  # noqa: E731
    stem, tail = draw(80), draw(3)
    prompts = [stem + instance + draw(2) + tail
               for instance in (draw(24) for _ in range(3)) for _ in range(4)]
    return prompts + prompts[:1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tree_of_prefixes_runs_each_shared_prefix_once(backend, request, monkeypatch):
    model, module, pad = make(backend, request)
    prompts = tree_prompts()
    distinct = list(dict.fromkeys(prompts))
    cuts, cost = prefix_levels(distinct)
    assert cuts == [80, 104, 109]
    last, mask, _, ran = prefix_tree(model, model.prefix, distinct, cuts, 1, pad)
    assert ran == 80 + 3 * 24 + 12 * 5 == cost - 3 * LEVEL_COST  # against 12 * 109 whole
    ids, full = generation.left_pad(distinct, pad)
    torch.testing.assert_close(last, model.logits(ids, full)[:, -1], atol=1e-5, rtol=0)
    assert torch.equal(mask.sum(1), full.sum(1))
    rng = random.Random(3)
    comps = [tuple(rng.randrange(3, 90) for _ in range(rng.randint(1, 4))) for _ in prompts]
    comps[4] = ()
    used = []
    tree = generation._logits_tree
    monkeypatch.setattr(generation, "_logits_tree",
                        lambda *a, **k: used.append(a[3]) or tree(*a, **k))
    assert_scored_as_alone(model, module, pad, prompts, comps)
    assert used == [cuts]


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


def long_and_short_prompts() -> list[tuple[int, ...]]:
    """One agent's four prompts share a 60-token stem; another's six are 3 tokens long."""
    stem = tuple(range(3, 63))
    return [(1,) + stem + (t,) for t in (7, 8, 9, 10)] + [(2, t, 5) for t in range(6)]


def test_prompts_are_grouped_only_where_one_tree_would_run_padding():
    prompts = agent_prompts()
    assert stem_length(prompts) == 0  # no stem for all of them
    # One tree: each agent's stem once at the first level, then every row's message.
    assert prefix_levels(prompts) == ([35, 38], 3 * 35 + 12 * 3 + 2 * LEVEL_COST)
    assert stem_groups(prompts) == [list(range(12))]
    # In one tree the short prompts would run padding through the long ones' stem.
    mixed = long_and_short_prompts()
    assert stem_groups(mixed) == [[0, 1, 2, 3], list(range(4, 10))]
    assert stem_groups(mixed, most=1) == [list(range(10))]


@pytest.mark.parametrize("backend", BACKENDS)
def test_scoring_group_by_group_equals_scoring_each_row_alone(backend, request):
    model, module, pad = make(backend, request)
    prompts = long_and_short_prompts()
    rng = random.Random(2)
    comps = [tuple(rng.randrange(3, 90) for _ in range(rng.randint(1, 4))) for _ in prompts]
    comps[5] = ()  # a row with nothing to score
    assert_scored_as_alone(model, module, pad, prompts, comps)
