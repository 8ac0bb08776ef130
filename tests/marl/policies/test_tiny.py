import pytest
import torch

from marl.errors import MarlError
from marl.policies import generation
from marl.policies.base import Request
from marl.policies.generation import Sampling, completion_text, generate, left_pad, score
from marl.policies.lm import LMPolicy
from marl.policies.tiny import TinyCausalLM, TinyConfig, TinyLM, load_tiny, save_tiny
from marl.tokenizer import CharTokenizer

TOK = CharTokenizer()


@pytest.fixture(scope="module")
def lm() -> TinyCausalLM:
    torch.manual_seed(0)
    return TinyCausalLM(TinyLM(TinyConfig()))


def prompts() -> list[list[int]]:
    return [TOK.encode_prompt(t) for t in ("you are a (x). value: 3\n[round 1]\na> ", "hi",
                                           "w1> 7???\nlead answer> ")]


def test_presets():
    assert 300_000 < TinyLM(TinyConfig.from_preset("tiny")).num_params() < 500_000
    small = TinyConfig.from_preset("small")
    assert (small.n_layer, small.n_embd) == (4, 256)
    with pytest.raises(MarlError, match="unknown model preset 'huge'.*tiny"):
        TinyConfig.from_preset("huge")
    with pytest.raises(MarlError, match="n_head"):
        TinyConfig(n_embd=64, n_head=5)
    with pytest.raises(MarlError, match="embed_std=0.0 must be > 0"):
        TinyConfig(embed_std=0.0)


@pytest.mark.parametrize("std", [None, 0.2])
def test_token_embeddings_start_at_embed_std(tmp_path, std):
    """A preset file sets the embeddings' initial scale; the default is GPT-2's 0.02."""
    preset = tmp_path / "p.yaml"
    preset.write_text("n_embd: 128\n" + (f"embed_std: {std}\n" if std else ""))
    torch.manual_seed(0)
    model = TinyLM(TinyConfig.from_preset(str(preset)))
    assert float(model.embed.weight.std()) == pytest.approx(std or 0.02, rel=0.05)
    assert float(model.head.weight.std()) == pytest.approx(0.02, rel=0.05)


def test_left_padding_does_not_change_logits(lm):
    ps = prompts()
    ids, mask = left_pad(ps, TOK.pad_id)
    batch = lm.logits(ids, mask)
    for i, p in enumerate(ps):
        alone = lm.logits(*left_pad([p], TOK.pad_id))[0]
        torch.testing.assert_close(batch[i, -len(p):], alone, atol=1e-5, rtol=1e-5)


def test_kv_cache_matches_full_forward(lm):
    ps = prompts()
    ids, mask = left_pad(ps, TOK.pad_id)
    last, cache = lm.prefill(ids, mask, 3)
    steps = [last]
    for _ in range(3):
        nxt = torch.full((len(ps), 1), TOK.encode("x")[0])
        ids, mask = torch.cat([ids, nxt], 1), torch.cat([mask, torch.ones_like(nxt).bool()], 1)
        logits, cache = lm.decode(nxt, mask, cache)
        steps.append(logits)
    full = lm.logits(ids, mask)
    for t, logits in enumerate(steps):
        torch.testing.assert_close(logits, full[:, -4 + t], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("s", [Sampling(max_new_tokens=6, stop=()),
                               Sampling(temperature=0.7, top_k=5, max_new_tokens=6, stop=()),
                               Sampling(temperature=0.0, max_new_tokens=6, stop=())])
def test_sampled_logprobs_equal_scored_logprobs(lm, s):
    gen = torch.Generator().manual_seed(3)
    out = generate(lm, prompts(), s, pad_id=TOK.pad_id, eos_id=None, decode=TOK.decode,
                   generator=gen)
    comps = [out.tokens[i][out.mask[i]].tolist() for i in range(3)]
    lp, m = score(lm, prompts(), comps, pad_id=TOK.pad_id, temperature=s.temperature)
    torch.testing.assert_close(lp[m], out.logprobs[out.mask], atol=1e-4, rtol=1e-4)
    assert lp.requires_grad


def test_generation_is_deterministic_for_a_seed(lm):
    outs = [generate(lm, prompts(), Sampling(max_new_tokens=8), pad_id=TOK.pad_id,
                     eos_id=TOK.eos_id, decode=TOK.decode,
                     generator=torch.Generator().manual_seed(5)).tokens for _ in range(2)]
    assert torch.equal(*outs)


def test_top_k_one_is_greedy(lm):
    greedy = generate(lm, prompts(), Sampling(temperature=0.0, max_new_tokens=5, stop=()),
                      pad_id=TOK.pad_id, eos_id=None, decode=TOK.decode)
    k1 = generate(lm, prompts(), Sampling(top_k=1, max_new_tokens=5, stop=()),
                  pad_id=TOK.pad_id, eos_id=None, decode=TOK.decode,
                  generator=torch.Generator().manual_seed(0))
    assert torch.equal(greedy.tokens, k1.tokens)


def test_stop_strings_and_eos_end_each_sequence(lm):
    # Bias the model toward one character so that the stop string comes at once.
    biased = TinyLM(TinyConfig(tie_embeddings=True))  # the embedding is also the head
    with torch.no_grad():
        biased.embed.weight.zero_()
        biased.embed.weight[TOK.encode("z")[0]] = 1.0
        for b in biased.blocks:
            b.down.weight.zero_()
            b.proj.weight.zero_()
    model = TinyCausalLM(biased)
    p = [TOK.encode_prompt("z")]
    out = generate(model, p, Sampling(temperature=0.0, max_new_tokens=6, stop=("zz",)),
                   pad_id=TOK.pad_id, eos_id=TOK.eos_id, decode=TOK.decode)
    assert out.finish == ["stop"] and int(out.mask.sum()) == 2
    assert completion_text(out.tokens[0][out.mask[0]].tolist(), TOK.decode, ("zz",)) == ""
    out = generate(model, p, Sampling(temperature=0.0, max_new_tokens=4, stop=()),
                   pad_id=TOK.pad_id, eos_id=TOK.encode("z")[0], decode=TOK.decode)
    assert out.finish == ["eos"] and int(out.mask.sum()) == 1
    out = generate(model, p, Sampling(temperature=0.0, max_new_tokens=4, stop=()),
                   pad_id=TOK.pad_id, eos_id=None, decode=TOK.decode)
    assert out.finish == ["length"] and int(out.mask.sum()) == 4


def test_save_load_roundtrip(tmp_path, lm):
    path = save_tiny(lm.model, tmp_path / "ckpt")
    again = load_tiny(path)
    ids, mask = left_pad(prompts(), TOK.pad_id)
    torch.testing.assert_close(again(ids, mask), lm.model(ids, mask))
    save_tiny(again, path)  # overwriting keeps a valid checkpoint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    with pytest.raises(MarlError, match="config.json"):
        load_tiny(tmp_path / "nothing")


def test_lm_policy_completions_and_training_signal(lm):
    policy = LMPolicy(lm, TOK, Sampling(max_new_tokens=5, stop=("\n",)), seed=1,
                      module=lm.model)
    reqs = [Request("a", "you are a (x). hi\n[round 1]\na> "), Request("b", "b answer> ", True)]
    out = policy.generate(reqs)
    assert all(len(c.token_ids) == len(c.logprobs) <= 5 for c in out)
    assert all("\n" not in c.text for c in out)
    lp, m = policy.score([c.prompt_ids for c in out], [c.token_ids for c in out])
    loss = -(lp * m).sum()
    loss.backward()
    grads = [p.grad for p in policy.parameters()]
    assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)
    greedy = [c.text for c in policy.generate(reqs, greedy=True)]
    assert greedy == [c.text for c in policy.generate(reqs, greedy=True)]


def test_lumped_kl_is_blind_to_which_symbol_but_not_to_the_format():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 12, requires_grad=True)
    support = torch.tensor([[[1, 4, 7], [2, 3, -1], [-1, -1, -1]]] * 2)
    logq = torch.log_softmax(logits.detach(), -1)
    # the reference: the policy with its first two positions' symbols shuffled
    shuffled = logits.detach().clone()
    shuffled[:, 0, [1, 4, 7]] = shuffled[:, 0, [7, 1, 4]]
    shuffled[:, 1, [2, 3]] = shuffled[:, 1, [3, 2]]
    logr = torch.log_softmax(shuffled, -1)
    logp = torch.log_softmax(logits, -1)
    lumped = generation.lumped_kl(logp, logr, support)
    full = (logp.exp() * (logp - logr)).sum(-1)
    assert torch.allclose(lumped, torch.zeros_like(lumped), atol=1e-6) and (full[:, :2] > 0).all()
    lumped.sum().backward()
    assert logits.grad.abs().max() < 1e-6  # no pull back to the reference's symbols
    # a move of mass off the alphabet is anchored as the whole KL would anchor it
    off = logits.detach().clone()
    off[:, :, [1, 4, 7, 2, 3]] -= 2.0
    logo = torch.log_softmax(off, -1)
    assert (generation.lumped_kl(logo, logq, support)[:, :2] > 0.05).all()
    lumped_third = generation.lumped_kl(logo, logq, support)[:, 2]
    assert torch.allclose(lumped_third, (logo.exp() * (logo - logq)).sum(-1)[:, 2])


def test_score_lumps_the_kl_over_the_support_only_when_asked(lm):
    torch.manual_seed(1)
    reference = TinyCausalLM(TinyLM(TinyConfig()))
    ps = prompts()
    comps = [TOK.encode("12"), TOK.encode("a"), TOK.encode("9x")]
    digits = [TOK.encode(c)[0] for c in "0123456789"]
    support = torch.tensor([[digits, [-1] * 10]] * 3)  # the first token is a digit
    with torch.no_grad():
        _, mask, full = score(lm, ps, comps, pad_id=TOK.pad_id, reference=reference,
                              support=support)[:3]
        _, _, lumped = score(lm, ps, comps, pad_id=TOK.pad_id, reference=reference,
                             support=support, lump_support=True)[:3]
    assert (lumped[:, 0] < full[:, 0]).all()  # data processing: a coarser KL is smaller
    assert torch.equal(lumped[:, 1:], full[:, 1:])  # no support there: the whole KL
    with torch.no_grad():  # kl_scope: answers lumps the masked rows only
        rows = torch.tensor([True, False, True])
        some = score(lm, ps, comps, pad_id=TOK.pad_id, reference=reference, support=support,
                     lump_support=rows)[2]
    assert torch.equal(some[rows], lumped[rows]) and torch.equal(some[~rows], full[~rows])
