"""The ``hf`` backend on a tiny random Llama written to disk and loaded back with load_hf."""

import random
import sys

import pytest
import torch

from marl.errors import MarlError
from marl.policies.generation import Sampling, completion_text, generate, left_pad, score
from marl.policies.hf import load_hf, save_hf
from marl.policies.hf_local import build_tiny_hf
from marl.tokenizer import CHARSET, CharTokenizer

# hf.py and hf_local.py import transformers lazily, so only the tests need it.
pytest.importorskip("transformers")

OBSERVATIONS = ["round 1: w1 says 07\nanswer?", "x", "hello world, (a+b)*c = 12 ;\n\n  end"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_hf(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return build_tiny_hf(tmp_path_factory.mktemp("chat") / "model", chat_template=True)


@pytest.fixture(scope="module")
def loaded(tiny_dir):
    return load_hf(tiny_dir)


def prompts_of(tok):
    return [tok.encode_prompt(o) for o in OBSERVATIONS]


def test_tokenizer_round_trips_charset_text(loaded):
    _, tok = loaded
    rng = random.Random(0)
    text = "".join(rng.choice(CHARSET) for _ in range(2000)) + "  a \n\n b  \n"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert ids == CharTokenizer().encode(text)  # same ids as the built-in tokenizer
    assert tok.count(text) == len(text)
    assert tok.decode([tok.bos_id, *tok.encode("ab"), tok.eos_id, tok.pad_id]) == "ab"
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, 100)
    assert tok.prefix_stable is False


def test_remembered_ids_equal_the_tokenizers_and_cannot_be_corrupted(tiny_dir, monkeypatch):
    _, tok = load_hf(tiny_dir)
    monkeypatch.setattr(type(tok), "MEMO", 3)
    calls = []
    backend = tok._backend

    class Counting:  # the Rust tokenizer's methods cannot be patched
        def encode(self, text, **kw):
            calls.append(text)
            return backend.encode(text, **kw)

    monkeypatch.setattr(tok, "_backend", Counting())
    first = tok.encode("hello")
    first.append(99)  # a caller's edit must not reach the memo
    assert tok.encode("hello") == tok.tokenizer.encode("hello", add_special_tokens=False)
    assert calls == ["hello"]  # the second call was remembered
    for text in ("a", "b", "c"):  # "hello" is the oldest of four: forgotten
        tok.encode(text)
    tok.encode("hello")
    assert calls == ["hello", "a", "b", "c", "hello"] and len(tok._memo) == 3


def test_encode_gives_transformers_ids_even_when_the_backend_truncates(tiny_dir):
    from transformers import AutoTokenizer

    from marl.policies.hf import HFTokenizer

    hf_tok = AutoTokenizer.from_pretrained(tiny_dir)
    hf_tok.backend_tokenizer.enable_truncation(max_length=4)  # e.g. from a tokenizer.json
    hf_tok.backend_tokenizer.enable_padding(length=64)
    tok = HFTokenizer(hf_tok)
    for text in [*OBSERVATIONS, "<bos>hi<eos> é\t", ""]:
        ids = tok.encode(text)
        assert ids == hf_tok.encode(text, add_special_tokens=False), text
        assert len(ids) > 4 or len(text) <= 4
    slow = HFTokenizer(hf_tok)
    slow._backend, slow._memo = None, {}  # the path a slow (Python) tokenizer takes
    assert slow.encode(OBSERVATIONS[0]) == tok.encode(OBSERVATIONS[0])


def test_prompt_without_chat_template_starts_with_bos(loaded):
    _, tok = loaded
    assert tok.render("hi") == "<bos>hi"
    assert tok.encode_prompt("hi") == [tok.bos_id, *tok.encode("hi")]


def test_chat_template_renders_one_user_turn(chat_dir):
    _, tok = load_hf(chat_dir)
    assert tok.render("hi") == "<bos>user: hi\nassistant: "
    ids = tok.encode_prompt("hi")
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    assert ids == tok.encode(tok.render("hi"))


def test_left_padding_gives_the_same_logits(loaded):
    model, tok = loaded
    prompts = prompts_of(tok)
    with torch.no_grad():
        batch = model.logits(*left_pad(prompts, tok.pad_id))
        for i, p in enumerate(prompts):
            alone = model.logits(*left_pad([p], tok.pad_id))[0]
            torch.testing.assert_close(batch[i, -len(p):], alone, atol=1e-5, rtol=0)


def test_cached_decoding_matches_full_forward(loaded):
    model, tok = loaded
    ids, mask = left_pad(prompts_of(tok), tok.pad_id)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        last, cache = model.prefill(ids, mask, 6)
        torch.testing.assert_close(last, model.logits(ids, mask)[:, -1], atol=1e-4, rtol=0)
        for _ in range(6):
            new = torch.randint(4, tok.vocab_size, (len(ids), 1), generator=gen)
            ids = torch.cat([ids, new], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            last, cache = model.decode(new, mask, cache)
            torch.testing.assert_close(last, model.logits(ids, mask)[:, -1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
def test_generated_logprobs_match_score(loaded, temperature):
    model, tok = loaded
    prompts = prompts_of(tok)
    s = Sampling(temperature=temperature, top_k=20 if temperature == 0.7 else 0,
                 max_new_tokens=12, stop=())

    def run(seed):
        return generate(model, prompts, s, pad_id=tok.pad_id, eos_id=tok.eos_id,
                        decode=tok.decode, generator=torch.Generator().manual_seed(seed))

    out = run(0)
    comps = [out.tokens[i][out.mask[i]].tolist() for i in range(len(prompts))]
    lp, mask = score(model, prompts, comps, pad_id=tok.pad_id, temperature=temperature)
    for i, c in enumerate(comps):
        torch.testing.assert_close(lp[i, : len(c)], out.logprobs[i, : len(c)], atol=1e-4,
                                   rtol=0)
        assert mask[i].sum() == len(c)
    again = run(0)
    assert torch.equal(again.tokens, out.tokens) and torch.equal(again.mask, out.mask)
    if temperature > 0:
        assert not torch.equal(run(1).tokens, out.tokens)


@pytest.mark.parametrize("fast", [True, False])
def test_scoring_shares_a_repeated_prompt_with_the_same_result(tiny_dir, fast):
    """Rows that repeat a prompt (a group's rollouts) share its forward pass when scored,
    with and without the fast generation twin: log-probs and gradients as if each row ran
    alone."""
    model, tok = load_hf(tiny_dir, fast=fast)
    prompts = [tok.encode_prompt(o) for o in (OBSERVATIONS[0], OBSERVATIONS[0], "x", "x")]
    comps = [tok.encode(c) for c in ("ab\n", "c", "de\n", "fgh")]
    lp, mask = score(model, prompts, comps, pad_id=tok.pad_id)
    (lp * mask).sum().backward()
    shared = [p.grad.clone() for p in model.model.parameters()]
    model.model.zero_grad()
    alone = [score(model, [p], [c], pad_id=tok.pad_id) for p, c in zip(prompts, comps, strict=True)]
    sum((a * m).sum() for a, m in alone).backward()
    for i, (a, _) in enumerate(alone):
        torch.testing.assert_close(lp[i, : len(comps[i])], a[0], atol=1e-5, rtol=0)
    for g, p in zip(shared, model.model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-4)
    model.model.zero_grad()


def test_stop_string_cuts_generation(loaded):
    model, tok = loaded
    prompt = [tok.encode_prompt(OBSERVATIONS[0])]

    def run(stop):
        return generate(model, prompt, Sampling(temperature=0.0, max_new_tokens=24, stop=stop),
                        pad_id=tok.pad_id, eos_id=None, decode=tok.decode)

    free = run(())
    ids = free.tokens[0].tolist()
    text = tok.decode(ids)
    assert len(text) >= 6
    stop = text[4:6]
    n = next(k for k in range(1, len(ids) + 1) if stop in tok.decode(ids[:k]))
    cut = run((stop,))
    assert cut.finish == ["stop"] and int(cut.mask.sum()) == n
    assert cut.tokens[0, :n].tolist() == ids[:n]
    assert completion_text(ids[:n], tok.decode, (stop,)) == text[: text.index(stop)]


def test_lora_trains_only_the_adapter(tiny_dir, tmp_path):
    model, tok = load_hf(tiny_dir, lora={"r": 4, "alpha": 8})
    base, _ = load_hf(tiny_dir)
    params = dict(model.model.named_parameters())
    trainable = {n for n, p in params.items() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    assert len(trainable) < len(params)
    prompts, comps = prompts_of(tok), [[20, 21, 22], [30], [40, 41]]
    lp, mask = score(model, prompts, comps, pad_id=tok.pad_id)
    # A fresh adapter starts as the identity (lora_B = 0).
    torch.testing.assert_close(lp, score(base, prompts, comps, pad_id=tok.pad_id)[0],
                               atol=1e-5, rtol=0)
    before = {n: p.detach().clone() for n, p in params.items()}
    opt = torch.optim.SGD([params[n] for n in sorted(trainable)], lr=0.1)
    (-(lp * mask).sum()).backward()
    opt.step()
    changed = {n for n, p in params.items() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable

    with torch.no_grad():
        want = model.logits(*left_pad(prompts, tok.pad_id))
    save_hf(model, tok, tmp_path / "adapter")
    save_hf(model, tok, tmp_path / "merged", merge=True)
    save_hf(model, tok, tmp_path / "merged", merge=True)  # replaces the directory in place
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "merged"]
    for name in ("adapter", "merged"):
        again, _ = load_hf(tmp_path / name)
        with torch.no_grad():
            got = again.logits(*left_pad(prompts, tok.pad_id))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_build_is_deterministic_for_a_seed(tmp_path, loaded):
    model, _ = loaded
    same, _ = load_hf(build_tiny_hf(tmp_path / "a"))
    other, _ = load_hf(build_tiny_hf(tmp_path / "b", seed=1))
    w = model.model.lm_head.weight
    assert torch.equal(same.model.lm_head.weight, w)
    assert not torch.equal(other.model.lm_head.weight, w)


def test_bfloat16_loads_and_generates(tiny_dir):
    model, tok = load_hf(tiny_dir, dtype="bfloat16")
    assert next(model.model.parameters()).dtype == torch.bfloat16
    out = generate(model, prompts_of(tok), Sampling(max_new_tokens=4), pad_id=tok.pad_id,
                   eos_id=tok.eos_id, decode=tok.decode)
    assert out.tokens.shape[0] == len(OBSERVATIONS)


def test_missing_path_names_it(tmp_path):
    with pytest.raises(MarlError, match="does not exist") as e:
        load_hf(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(e.value)


def test_directory_without_config_names_what_is_missing(tmp_path):
    (tmp_path / "weights.bin").write_text("")
    with pytest.raises(MarlError, match="no config.json") as e:
        load_hf(tmp_path)
    assert str(tmp_path) in str(e.value) and "weights.bin" in str(e.value)


def test_missing_weights_name_the_path(tiny_dir, tmp_path):
    (tmp_path / "config.json").write_text((tiny_dir / "config.json").read_text())
    with pytest.raises(MarlError, match="cannot load") as e:
        load_hf(tmp_path)
    assert str(tmp_path) in str(e.value)


def test_bad_dtype_lists_valid_ones(tiny_dir):
    with pytest.raises(MarlError, match="'fp8'.*float32, bfloat16, float16"):
        load_hf(tiny_dir, dtype="fp8")


def test_unknown_lora_key_lists_valid_ones(tiny_dir):
    with pytest.raises(MarlError, match="rank.*r, alpha, dropout, target_modules"):
        load_hf(tiny_dir, lora={"rank": 4})


@pytest.mark.parametrize("device", ["gpu0", "cuda:0"])
def test_bad_device_fails_before_loading(tiny_dir, device):
    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(MarlError, match=f"device '{device}'"):
        load_hf(tiny_dir, device=device)


def test_missing_peft_names_the_extra(tiny_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(MarlError, match=r"llm-marl\[hf\]"):
        load_hf(tiny_dir, lora={})


def test_fast_twin_matches_transformers_and_follows_updates(tmp_path):
    from marl.policies.generation import Sampling, generate
    from marl.policies.hf_local import build_tiny_hf

    path = build_tiny_hf(tmp_path / "m", intermediate_size=96)
    fast, tok = load_hf(path)
    slow, _ = load_hf(path, fast=False)
    assert fast.twin is not None and slow.twin is None
    prompts = [tok.encode_prompt("you are a (x).\n[round 1]\na> "), tok.encode_prompt("hi")]
    s = Sampling(temperature=0.0, max_new_tokens=6, stop=())
    outs = [generate(m, prompts, s, pad_id=tok.pad_id, eos_id=None, decode=tok.decode)
            for m in (fast, slow)]
    assert torch.equal(outs[0].tokens, outs[1].tokens)
    torch.testing.assert_close(outs[0].logprobs, outs[1].logprobs, atol=1e-4, rtol=1e-4)
    # An optimizer step on the transformers weights reaches the twin before it samples.
    with torch.no_grad():
        for p in fast.model.parameters():
            p.add_(0.5 * torch.randn_like(p))
            break
    again = generate(fast, prompts, s, pad_id=tok.pad_id, eos_id=None, decode=tok.decode)
    ids, mask = torch.tensor([prompts[0]]), torch.ones(1, len(prompts[0]), dtype=torch.bool)
    expected = fast.logits(ids, mask)[0, -1].log_softmax(-1).max()
    torch.testing.assert_close(again.logprobs[0, 0], expected, atol=1e-4, rtol=1e-4)


def test_lora_models_have_no_fast_twin(tmp_path):
    from marl.policies.hf_local import build_tiny_hf

    lm, _ = load_hf(build_tiny_hf(tmp_path / "m"), lora={"r": 2})
    assert lm.twin is None


def test_a_chat_prompt_format_renders_system_user_and_assistant_turns():
    from marl.policies.hf import HFTokenizer
    from marl.policies.hf_local import char_tokenizer

    obs = "you are b (x). v\n[round 1]\na> hi\nb> yo\n[round 2]\na> one\nb answer> "
    tok = HFTokenizer(char_tokenizer(chat_template=True), chat=True)
    # the test builder's template writes "role: content" per turn
    assert tok.render(obs) == ("<bos>system: you are b (x). v\nuser: [round 1]\na: hi\n"
                               "Your message:\nassistant: yo\nuser: [round 2]\na: one\n"
                               "Your answer:\nassistant: ")
    assert tok.encode_prompt(obs) == tok.encode(tok.render(obs))
    one_turn = HFTokenizer(char_tokenizer(chat_template=True))
    assert one_turn.render(obs) == f"<bos>user: {obs}\nassistant: "


def test_chat_template_arguments_reach_the_template():
    from marl.policies.hf import HFTokenizer
    from marl.policies.hf_local import char_tokenizer

    raw = char_tokenizer(chat_template=True)
    raw.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                         "{% if think %}<think>{% endif %}")
    obs = "you are a (x). v\n[round 1]\na> "
    plain = HFTokenizer(raw, chat=True)
    thinking = HFTokenizer(raw, chat=True, template_kwargs={"think": True})
    assert thinking.render(obs) == plain.render(obs) + "<think>"


def test_a_chat_prompt_format_needs_a_chat_template():
    from marl.policies.hf import HFTokenizer
    from marl.policies.hf_local import char_tokenizer

    with pytest.raises(MarlError, match="prompt_format: chat needs a chat template"):
        HFTokenizer(char_tokenizer(), chat=True)
