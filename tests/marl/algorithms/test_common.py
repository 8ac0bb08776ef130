"""Training samples: demonstrations only where the oracle knows the answer."""

import pytest
import torch

from marl.algorithms.common import oracle_episodes, samples_for, score_rows, trainables, update
from marl.algorithms.config import TrainConfig
from marl.policies.scripted import ScriptedPolicy
from marl.rollout import collect
from marl.runner import build_policies
from marl.team import load_team
from tests.marl.conftest import ROOT


def listener_demos(scripted_speaker: bool) -> tuple[list[str], list[str]]:
    team = load_team(ROOT / "scenarios" / "signal.yaml")
    policies = build_policies(team, seed=0)
    if scripted_speaker:
        policies["speaker"] = ScriptedPolicy(team.task)
    batch = collect(team, policies, episodes=8, group_size=4, seed=0)
    listener = next(t for t in trainables(team, policies, TrainConfig()) if t.name == "listener")
    s = samples_for(listener, team, batch, torch.zeros(len(batch.records), 2), with_demos=True)
    sent = [r["transcript"][0]["message"] for r in batch.records]
    return sent, [listener.policy.tokenizer.decode(d) for d in s.demos]


def test_listener_demos_decode_the_code_it_heard():
    sent, demos = listener_demos(scripted_speaker=True)
    assert demos == [f"{'abcd'.index(m)}\n" for m in sent]


def test_no_listener_demos_for_noise():
    # An untrained speaker babbles: no valid code arrives, so the oracle would only guess.
    sent, demos = listener_demos(scripted_speaker=False)
    assert not any(len(m) == 1 and m in "abcd" for m in sent)
    assert demos == [""] * len(sent)


def test_score_rows_runs_duplicates_once_with_the_same_gradient():
    team = load_team(ROOT / "scenarios" / "signal.yaml")
    policies = build_policies(team, seed=0)
    t = next(t for t in trainables(team, policies, TrainConfig()) if t.name == "speaker")
    a, b = [1, 5, 6, 7], [1, 5, 8]
    prompts, completions = [a, b, a, a, b], [[9, 3], [4], [9, 3], [2], [4]]
    calls = []
    real = t.policy.score
    t.policy.score = lambda p, c, **kw: calls.append(len(p)) or real(p, c, **kw)
    weights = torch.tensor([[1.0, 2.0], [3.0, 0.0], [-1.0, 0.5], [2.0, 0.0], [0.5, 0.0]])
    lp, mask = score_rows(t, prompts, completions)
    assert calls == [3]  # three distinct pairs
    (lp * weights * mask).sum().backward()
    fast = [p.grad.clone() for p in t.policy.parameters()]
    t.optimizer.zero_grad()
    lp2, mask2 = real(prompts, completions)
    (lp2 * weights * mask2).sum().backward()
    assert torch.equal(mask, mask2)
    assert torch.allclose(lp, lp2, atol=1e-6)
    for g, h in zip(fast, (p.grad for p in t.policy.parameters()), strict=True):
        assert torch.allclose(g, h, rtol=1e-4, atol=1e-5 * float(h.abs().max()))


def test_oracle_episodes_add_demonstration_rows():
    # With demo_episodes, the oracle plays fresh instances alone; every call of the policy's
    # agents there is a demonstration row with no completion and advantage 0.
    team = load_team(ROOT / "scenarios" / "gather_star.yaml")
    policies = build_policies(team, seed=0)
    batch = collect(team, policies, episodes=2, group_size=2, seed=0)
    oracle = oracle_episodes(team, policies, 3, seed=5)
    assert oracle.success.all()
    lead = next(t for t in trainables(team, policies, TrainConfig()) if t.name == "lead")
    adv = torch.ones(len(batch.records), len(team.ids))
    s = samples_for(lead, team, batch, adv, True, oracle)
    assert len(s.prompts) == 4 + 3
    assert s.completions[4:] == [[], [], []] and not s.mask[4:].any()
    assert s.advantages[4:].eq(0).all() and s.advantages[:4].eq(1).all()
    decode = lead.policy.tokenizer.decode
    assert [decode(d) for d in s.demos[4:]] == [f"{r['target']}\n" for r in oracle.records]
    assert [decode(list(p)) for p in s.prompts[4:]] == [
        decode(lead.policy.tokenizer.encode_prompt(o[-1])) for o in oracle.observations]
    before = [p.detach().clone() for p in lead.policy.parameters()]
    only_demos = samples_for(lead, team, batch, adv, True, oracle)
    only_demos.completions[:4] = [[], [], [], []]  # the team's own rows: nothing to train
    only_demos.demos[:4] = [[], [], [], []]
    stats = update(lead, only_demos, TrainConfig(epochs=1, minibatches=1), sft_coef=1.0,
                   seed=0)
    assert stats["sft_loss"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, lead.policy.parameters(),
                                                      strict=True))


def test_oracle_episodes_are_seeded():
    team = load_team(ROOT / "scenarios" / "gather_star.yaml")
    policies = build_policies(team, seed=0)
    a, b, c = (oracle_episodes(team, policies, 4, seed=s) for s in (1, 1, 2))
    assert a.observations == b.observations != c.observations


def test_habits_are_seeded_distinct_per_agent_and_stable():
    from marl.algorithms.warmup import Habits

    team = load_team(ROOT / "scenarios" / "signal.yaml")
    habits = Habits(seed=3)
    observations = [f"you are speaker (speaker). object: {i}\n" for i in range(4)]
    codes = [habits.message(team, "speaker", o) for o in observations]
    assert len(set(codes)) == 4  # four objects, four different habits
    assert all(team.task.valid_message("speaker", c, False) for c in codes)
    assert codes == [habits.message(team, "speaker", o) for o in observations]  # stable
    again = Habits(seed=3)
    assert codes == [again.message(team, "speaker", o) for o in observations]  # seeded
    other = Habits(seed=4)
    assert codes != [other.message(team, "speaker", o) for o in observations]
    # answers get habits too: valid answers, distinct while the four digits last
    heard = [f"you are listener (listener). object: ?\nspeaker> {c}\n" for c in "abcdef"]
    answers = [habits.message(team, "listener", o, final=True) for o in heard]
    assert all(team.task.valid_message("listener", a, True) for a in answers)
    assert len(set(answers[:4])) == 4
    # a format with room for only two messages: the third habit must repeat one
    small = Habits(seed=0)
    team.task.random_message = lambda agent, final, rng: "ab"[int(rng.integers(2))]
    assert len({small.message(team, "speaker", o) for o in observations}) == 2



def test_habit_agreement_is_one_for_habits_and_near_chance_for_noise():
    from marl.algorithms.warmup import HabitPolicy, Habits, habit_agreement
    from marl.policies.scripted import RandomPolicy

    team = load_team(ROOT / "scenarios" / "signal.yaml")
    habits = Habits(seed=1)
    played = collect(team, dict.fromkeys(team.ids, HabitPolicy(team, habits, 1.0)), 32, 1,
                     seed=0)
    table = {a: dict(t) for a, t in habits.table.items()}
    assert habit_agreement(team, played, habits) == {"speaker": 1.0, "listener": 1.0}
    noise = collect(team, dict.fromkeys(team.ids, RandomPolicy(team.task, 0)), 64, 1, seed=1)
    rates = habit_agreement(team, noise, habits)
    assert rates["speaker"] < 0.2 and rates["listener"] < 0.5  # 1/26 and 1/4 by chance
    # peeking at habits for observations never met records nothing
    assert habits.table == table
    unseen = "you are listener (listener). object: ?\n[round 1]\nspeaker> zz\nlistener answer> "
    habit = habits.peek(team, "listener", unseen, final=True)
    assert unseen not in habits.table["listener"]
    assert habits.message(team, "listener", unseen, final=True) == habit

def test_the_minibatch_order_follows_the_seed_not_the_row_count():
    team = load_team(ROOT / "scenarios" / "signal.yaml")
    results = []
    for seed in (1, 2):
        policies = build_policies(team, seed=0)
        t = next(t for t in trainables(team, policies, TrainConfig()) if t.name == "speaker")
        batch = collect(team, policies, 4, 2, seed=0)
        adv = torch.linspace(-1, 1, len(batch.records))[:, None].expand(-1, 2)
        s = samples_for(t, team, batch, adv, with_demos=False)
        update(t, s, TrainConfig(minibatches=4), sft_coef=0.0, seed=seed)
        results.append([p.detach().clone() for p in t.policy.parameters()])
    assert any(not torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_a_policy_seed_of_zero_is_used():
    from marl.policies import build_policy

    team = load_team(ROOT / "scenarios" / "signal.yaml")
    spec = team.scenario.policies["speaker"]
    zero = build_policy(spec.model_copy(update={"seed": 0}), team.task, seed=5)
    run = build_policy(spec, team.task, seed=5)
    assert zero.generator.initial_seed() == 0 and run.generator.initial_seed() == 5


def signal_samples(support):
    team = load_team(ROOT / "scenarios" / "signal.yaml")
    policies = build_policies(team, seed=0)
    batch = collect(team, policies, episodes=4, group_size=4, seed=0)
    ts = {t.name: t for t in trainables(team, policies, TrainConfig(kl_coef=0))}
    adv = torch.zeros(len(batch.records), 2)
    return ts, {n: samples_for(t, team, batch, adv, False, support=support)
                for n, t in ts.items()}


def test_samples_carry_each_calls_alphabet_as_token_ids():
    ts, s = signal_samples(support="all")
    tok = ts["listener"].policy.tokenizer
    digits = [tok.encode(c)[0] for c in "0123"]  # signal: 4 objects, one-letter code
    letters = [tok.encode(c)[0] for c in "abcdefghijklmnopqrstuvwxyz"]
    assert s["listener"].support.shape == (16, 1, 4)
    assert (s["listener"].support[:, 0] == torch.tensor(digits)).all()
    assert s["speaker"].support.shape == (16, 1, 26)
    assert (s["speaker"].support[:, 0] == torch.tensor(letters)).all()
    assert s["listener"].answer.all() and not s["speaker"].answer.any()
    _, answers = signal_samples(support="answers")  # answer_floor: the answers' only
    assert torch.equal(answers["listener"].support, s["listener"].support)
    assert (answers["speaker"].support == -1).all()
    assert signal_samples(support=None)[1]["listener"].support is None


def test_told_answers_are_held_to_their_format_not_to_their_symbol():
    """answer_feedback: full tells an answer which symbol scores, so its KL term counts the
    alphabet as one outcome: a reference that differs from the policy only in which digit
    it favours costs the answer nothing, in both scoring paths. Learnt from the sampled
    reward, the same answer keeps the whole KL."""
    import copy
    import dataclasses

    from marl.algorithms.common import _minibatch_loss, pg_terms

    ts, s = signal_samples(support="answers")
    listener, rows = ts["listener"], s["listener"]
    rows = dataclasses.replace(  # each answer's first token: the one with an alphabet
        rows, completions=[c[:1] for c in rows.completions],
        old_logprobs=rows.old_logprobs[:, :1], mask=rows.mask[:, :1])
    digits = rows.support[0, 0]
    reference = copy.deepcopy(listener.policy.model)
    with torch.no_grad():  # the reference favours the digits the other way round
        head = reference.model.head.weight
        head[digits] = head[digits.flip(0)]
    listener.reference = reference
    every = list(range(len(rows.prompts)))
    for feedback in ("full", "sampled"):
        cfg = TrainConfig(answer_feedback=feedback)
        kls = [pg_terms(listener, rows, cfg)[1]["kl"],
               _minibatch_loss(listener, rows, every, cfg, 0.0)[1]["kl"]]
        if feedback == "full":
            assert kls == pytest.approx([0.0, 0.0], abs=1e-6)
        else:
            assert min(kls) > 1e-3


def test_pg_loss_is_the_policy_gradient_term_and_loss_the_total():
    team = load_team(ROOT / "scenarios" / "signal.yaml")
    policies = build_policies(team, seed=0)
    batch = collect(team, policies, episodes=4, group_size=4, seed=0)
    adv = torch.randn(len(batch.records), 2, generator=torch.Generator().manual_seed(0))
    cfg = TrainConfig(kl_coef=0, entropy_coef=0.5, entropy_target=None, answer_floor=0)
    t = trainables(team, policies, cfg)[1]
    stats = update(t, samples_for(t, team, batch, adv, False), cfg, 0.0, 0)
    assert abs(stats["pg_loss"]) > 1e-3  # random advantages: a gradient term of its own
    assert stats["loss"] == pytest.approx(stats["pg_loss"] - 0.5 * stats["entropy"])


def answer_probs(t, s) -> torch.Tensor:
    """The listener's probability of each of the 4 answers' symbol in the first row's
    context (the first token of its answer)."""
    tok = t.policy.tokenizer
    with torch.no_grad():
        lp, _ = t.policy.score([s.prompts[0]] * 4, [tok.encode(c) for c in "0123"])
    return lp[:, 0].exp()


def test_answer_floor_lifts_answers_given_too_rarely_and_nothing_else():
    # No advantage, KL or entropy. The untrained listener gives each answer about 1/97 of
    # the time: below half its share (0.5 / 4), so the term lifts all four; with a floor
    # every answer already clears (1e-6 / 4), the term is 0 and nothing moves.
    for floor in (1e-6, 0.5):
        ts, s = signal_samples(support="answers")
        t = ts["listener"]
        before = answer_probs(t, s["listener"])
        cfg = TrainConfig(kl_coef=0, entropy_coef=0, answer_floor=floor, lr=3e-3)
        rare = [update(t, s["listener"], cfg, 0.0, step)["rare_answers"] for step in range(30)]
        after = answer_probs(t, s["listener"])
        if floor < 1e-3:
            assert torch.equal(before, after) and rare == [0.0] * 30
        else:
            assert (before < floor / 4).all() and rare[0] == 1.0
            assert (after > 3 * before).all()


def test_cipher_habits_encipher_what_was_read_letter_by_letter():
    from marl.algorithms.warmup import Habits, read_symbols

    team = load_team(ROOT / "scenarios" / "relay_chain.yaml")  # 4-letter facts
    habits = Habits(seed=5, ciphers=True)
    said = habits.message(team, "a0", "you are a0 (relay). fact: abca\n")
    assert team.task.valid_message("a0", said, False)
    assert said[0] == said[3] and len(set(said[:3])) == 3  # one symbol per letter
    # the same cipher wherever a letter stands, and for every fact
    assert habits.message(team, "a0", "you are a0 (relay). fact: cbaa\n") == \
        said[2] + said[1] + said[0] + said[0]
    # a relay enciphers what it heard, with a cipher of its own, seeded by the run
    heard = "you are a1 (relay). fact: ????\n[round 1]\na0> abca\na1>"
    relayed = habits.message(team, "a1", heard)
    assert relayed != said and relayed[0] == relayed[3]
    assert Habits(seed=5, ciphers=True).peek(team, "a1", heard) == relayed
    assert Habits(seed=6, ciphers=True).peek(team, "a1", heard) != relayed
    # nothing well formed heard: a habit for the whole observation, still well formed
    garbled = "you are a1 (relay). fact: ????\n[round 1]\na0> ab!\na1>"
    assert read_symbols(team, "a1", garbled, False) is None
    assert team.task.valid_message("a1", habits.message(team, "a1", garbled), False)


def test_a_relays_cipher_is_chosen_by_what_it_knows():
    """An agent passing on a message it heard enciphers it with a cipher chosen by what
    it knows privately, so its own knowledge reaches the next agent too: on a three-agent
    gather chain the middle agent's habits tell all 25 pairs of values apart. Other
    messages do not choose it, and an agent enciphering its own field keeps one cipher."""
    from marl.algorithms.warmup import HabitPolicy, Habits, read_fields

    team = load_team(ROOT / "benchmarks" / "generality" / "gather_3_chain.yaml")
    habits = Habits(seed=0, ciphers=True)
    batch = collect(team, dict.fromkeys(team.ids, HabitPolicy(team, habits, 1.0, 0)), 200,
                    seed=0)
    pairs: dict[tuple[int, int], set[str]] = {}
    for record, instance in zip(batch.records, batch.instances, strict=True):
        said = next(c["message"] for c in record["transcript"] if c["agent"] == "g1")
        pairs.setdefault(tuple(instance.data["values"][:2]), set()).add(said)
    assert len(pairs) == 25 and all(len(s) == 1 for s in pairs.values())
    assert len(set.union(*pairs.values())) == 25  # a distinct message for every pair
    heard = "you are g1 (worker). value: {}\n[round 1]\ng0> 3?7\ng1>"
    assert read_fields(team, "g1", heard.format(2), False) == ("3?7", "2")
    assert habits.peek(team, "g1", heard.format(2)) != habits.peek(team, "g1", heard.format(4))
    # a tree's inner worker: the first child's table, keyed by its own value alone
    tree = load_team(ROOT / "benchmarks" / "generality" / "gather_6_tree.yaml")
    inner = "you are w0 (worker). value: 1\n[round 1]\nw2> ???3??\nw3> ????{}?\nw0>"
    assert read_fields(tree, "w0", inner.format(0), False) == ("???3??", "1")
    assert habits.peek(tree, "w0", inner.format(0)) == habits.peek(tree, "w0", inner.format(2))
    # a relay knows nothing privately: one cipher, the same for every fact length
    relay = load_team(ROOT / "scenarios" / "relay_chain.yaml")
    assert read_fields(relay, "a1", "you are a1 (relay). fact: ????\n[round 1]\na0> abcd\na1>",
                       False) == ("abcd", "")
    # a voter enciphers its own label: the same cipher whatever it heard before
    vote = load_team(ROOT / "benchmarks" / "generality" / "vote_4_complete.yaml")
    seen = "you are c1 (voter). label: 7\n[round 1]\nc0> {}\nc1>"
    assert read_fields(vote, "c1", seen.format(3), False) == ("7", "")
    assert habits.peek(vote, "c1", seen.format(3)) == habits.peek(vote, "c1", seen.format(5))


def test_what_an_agent_read_is_the_first_field_that_fits_its_output():
    """Through the task contract alone (Task.symbols and the observation's layout): on a
    relay the fact an agent knows, else the first fact it heard (its oracle's reading);
    on a vote every agent's own label, answerer included; nothing where no field fits."""
    from marl.algorithms.warmup import read_symbols

    team = load_team(ROOT / "scenarios" / "relay_chain.yaml")
    played = collect(team, build_policies(team, "random"), 32, seed=1)
    for b, record in enumerate(played.records):
        for k, call in enumerate(record["transcript"]):
            seen = played.observations[b][k]
            final = team.is_final_call(call["agent"], call["round"])
            assert read_symbols(team, call["agent"], seen, final) == team.task.known_fact(seen)
    vote = load_team(ROOT / "benchmarks" / "generality" / "vote_3_star.yaml")
    played = collect(vote, build_policies(vote, "random"), 8, seed=1)
    for b, record in enumerate(played.records):
        for k, call in enumerate(record["transcript"]):
            seen = played.observations[b][k]
            final = vote.is_final_call(call["agent"], call["round"])
            label = seen.split("label: ")[1][0]
            assert read_symbols(vote, call["agent"], seen, final) == label
    # a listener's candidates (``0=bcq``) and the letter it heard are not an index
    signal = load_team(ROOT / "benchmarks" / "generality" / "signal_5_pick.yaml")
    seen = collect(signal, build_policies(signal, "random"), 1, seed=1).observations[0][1]
    assert seen.startswith("you are listener")
    assert read_symbols(signal, "listener", seen, True) is None


def test_team_codes_read_each_agents_code_back_and_habits_carry_it_to_longer_messages():
    import string

    import yaml

    from marl.algorithms.warmup import HabitPolicy, Habits, code_key, team_codes

    data = yaml.safe_load((ROOT / "scenarios" / "relay_chain.yaml").read_text())
    data["task"]["params"]["fact_length"] = 1
    short = load_team(data)
    cipher = Habits(seed=3, ciphers=True)
    player = HabitPolicy(short, cipher, strength=1.0, seed=0)
    batch = collect(short, dict.fromkeys(short.ids, player), 200, 1, seed=0)
    codes = team_codes(short, batch)
    letters = string.ascii_lowercase
    relay = codes[code_key("a1", False, letters)]
    assert len(relay) >= 20  # the letters a1 heard in 200 episodes
    for heard, said in relay.items():  # what it said for each letter it heard: its cipher
        assert cipher.peek(short, "a1", f"you are a1 (relay). fact: ?\n[round 1]\na0> "
                                        f"{heard}\na1>") == said
    assert code_key("a4", True, letters) in codes  # the answer's code, apart
    # the code carried to 2-letter messages, symbol by symbol; a letter it does not cover
    # keeps the warm-up cipher
    data["task"]["params"]["fact_length"] = 2
    longer = load_team(data)
    x, y, missing = sorted(relay)[:3]
    relay[x] = other = next(c for c in letters if c != relay[x])  # not the warm-up cipher
    del relay[missing]
    carried = Habits(seed=3, ciphers=True, codes=codes)
    heard = f"you are a1 (relay). fact: ??\n[round 1]\na0> {x}{y}\na1>"
    assert carried.message(longer, "a1", heard) == other + relay[y]
    heard = f"you are a1 (relay). fact: ??\n[round 1]\na0> {missing}{y}\na1>"
    assert carried.message(longer, "a1", heard) == \
        Habits(seed=3, ciphers=True).peek(longer, "a1", heard)[0] + relay[y]


def test_promotion_warmup_trains_on_the_code_the_passed_stage_shows():
    import yaml

    from marl.algorithms.warmup import HabitPolicy, Habits, promotion_warmup

    data = yaml.safe_load((ROOT / "scenarios" / "relay_chain.yaml").read_text())
    data["task"]["params"]["fact_length"] = 1
    short = load_team(data)
    data["task"]["params"]["fact_length"] = 2
    longer = load_team(data)
    cfg = TrainConfig(warmup_prior="ciphers", warmup_episodes=8, habit_strength=1.0, lr=3e-3,
                      curriculum=[{"after": 1}, {}], promotion_warmup=15)
    models = build_policies(longer)
    ts = trainables(longer, models, cfg)
    # the team played by a scripted code (every call well formed, its own cipher)
    shown = dict.fromkeys(short.ids, HabitPolicy(short, Habits(seed=9, ciphers=True), 1.0))
    out = promotion_warmup(ts, short, longer, shown, cfg, stage=1)
    assert out["code_symbols"] > 4 * 20  # each agent's code over most letters
    assert out["steps"] == 15 and out["sft_loss_last"] < out["sft_loss_first"]
    assert out["settled"] == 0 and all(out[f"steps_{t.name}"] == 15 for t in ts)


def test_promotion_warmup_stops_each_policy_once_it_follows_its_code(monkeypatch):
    import yaml

    from marl.algorithms import warmup
    from marl.algorithms.warmup import HabitPolicy, Habits, promotion_warmup

    data = yaml.safe_load((ROOT / "scenarios" / "relay_chain.yaml").read_text())
    data["task"]["params"]["fact_length"] = 1
    short = load_team(data)
    data["task"]["params"]["fact_length"] = 2
    longer = load_team(data)
    cfg = TrainConfig(warmup_prior="ciphers", warmup_episodes=4, habit_strength=1.0,
                      curriculum=[{"after": 1}, {}], promotion_warmup=40)
    ts = trainables(longer, build_policies(longer), cfg)
    shown = dict.fromkeys(short.ids, HabitPolicy(short, Habits(seed=9, ciphers=True), 1.0))
    # a0's loss is reported as 0 (carried): a0 stops after SETTLED_STEPS, the others go on
    real, calls = warmup.sft_steps, []

    def a0_carried(active, team, batch, cfg):
        calls.append([t.name for t in active])
        return {n: (0.0 if n == "a0" else loss, out)
                for n, (loss, out) in real(active, team, batch, cfg).items()}

    monkeypatch.setattr(warmup, "sft_steps", a0_carried)
    out = promotion_warmup(ts, short, longer, shown, cfg, stage=1)
    settled = warmup.SETTLED_STEPS
    assert out["steps"] == 40 and out["settled"] == 1
    assert out["steps_a0"] == settled and all(out[f"steps_a{i}"] == 40 for i in range(1, 5))
    assert all("a0" in c for c in calls[:settled]) and not any("a0" in c for c in calls[settled:])
    assert f"a0 {settled}, a1 40" in warmup.carried_text(out)
    assert "(1 of 5 followed it)" in warmup.carried_text(out)


def test_cipher_habits_are_habits_where_the_task_has_no_alphabets():
    """A dataset task's free-form answers have no alphabets to encipher: the ciphers prior
    gives each observation the habit the habits prior would (a random answer of the
    task's format, distinct across observations), and both learn from the same table."""
    from marl.algorithms.warmup import Habits

    team = load_team(ROOT / "scenarios" / "arith_star.yaml")
    agent = team.answer_agents[0]
    seen = ["problem: 2+3", "problem: 7*8", "problem: 9-4"]
    ciphers, habits = Habits(5, ciphers=True), Habits(5)
    said = [ciphers.message(team, agent, o, final=True) for o in seen]
    assert said == [habits.message(team, agent, o, final=True) for o in seen]
    assert len(set(said)) == 3


def test_influence_is_zero_on_the_same_input_and_grows_under_its_gradient():
    """influence_coef's bonus: the total variation between each token's distribution on
    what the agent read and on another task instance's observation of the same call."""
    import dataclasses

    from marl.algorithms.common import influence

    team = load_team(ROOT / "scenarios" / "signal.yaml")
    policies = build_policies(team, seed=0)
    batch = collect(team, policies, episodes=4, group_size=2, seed=0)
    listener = next(t for t in trainables(team, policies, TrainConfig()) if t.name == "listener")
    s = samples_for(listener, team, batch, torch.zeros(len(batch.records), 2), with_demos=False,
                    counter=True)
    # the same call of the next group's instance
    assert s.counter == [batch.prompt_ids[(b + 2) % 8][1] for b in range(8)]
    cfg = TrainConfig(algorithm="ppo", group_size=1)  # every row
    same = dataclasses.replace(s, counter=list(s.prompts))
    assert float(influence(listener, same, cfg)) == 0.0
    before = influence(listener, s, cfg)
    assert 0 < float(before) < 1
    for _ in range(10):
        listener.optimizer.zero_grad()
        (-influence(listener, s, cfg)).backward()
        listener.optimizer.step()
    assert float(influence(listener, s, cfg)) > float(before) + 0.05


def test_no_counterfactual_input_in_a_batch_of_one_instance():
    team = load_team(ROOT / "scenarios" / "signal.yaml")
    policies = build_policies(team, seed=0)
    batch = collect(team, policies, episodes=1, group_size=4, seed=0)
    t = trainables(team, policies, TrainConfig())[0]
    assert samples_for(t, team, batch, torch.zeros(4, 2), with_demos=False,
                       counter=True).counter is None
