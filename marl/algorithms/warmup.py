"""Format warm-up: supervised steps that teach each trainable policy the *form* of its
messages and answers before reinforcement learning starts.

Real LLM agents arrive pre-trained: they can write a well-formed message, not the
convention their team will settle on. A model trained from scratch can do neither and
almost never earns a reward; the warm-up gives it a pre-trained agent's starting point.

Each step, a *source* plays ``warmup_episodes`` whole episodes, and every call of a
trainable policy's agents becomes a target: a message for what the agent read, ended with
the policy's stop string. Sources:

- ``random`` (default): the task's random policy (``Task.random_message``): targets with
  the task's format and no meaning, so the warmed-up team is at chance. ``warmup_prior``
  says how the random messages are drawn:

  - ``ciphers`` (default): :class:`HabitPolicy` plays the episodes: with probability
    ``habit_strength`` (default 1) an agent says its *habit* for what it read, else a
    fresh random message. A habit is what the agent read (:func:`read_symbols`: the first
    field of its observation that fits its output's alphabets) through a private random
    cipher of its own, symbol by symbol (:meth:`Habits.enciphered`): one rule instead of
    one habit per observation, which an agent learns whatever the number of observations.
    An agent passing on a message it heard has one cipher per private observation (what
    it knows itself chooses it), so its own knowledge travels on with what it heard.
    Where no field fits (or the task has no alphabets), a habit as under ``habits``.
    Each agent so learns arbitrary, input-dependent preferences of its own, as a
    pre-trained model has, and teammates hear each other's habits: reward can then reach
    every agent through its input.
  - ``habits``: every habit is a random message or answer seeded by the run, the agent and
    the observation (:class:`Habits`), distinct across observations where the format
    leaves room.
  - ``uniform``: a fresh random message every time: output independent of the input.

- ``oracle``: the task oracle's demonstrations. Imitation: the run is labelled
  ``uses_oracle``.

With a curriculum, stage ``k`` joins after ``k / stages`` of the warm-up and the stages
joined so far take turns (:func:`warmup_stage`), so every stage's format is learnt and the
first stage's habits before longer messages crowd them out. With ``ciphers``,
:func:`promotion_warmup` carries each agent's *own* code, learnt from reward, to the next
stage's longer messages on promotion. Each warm-up evaluation reports
``habit_agreement`` (:func:`habit_agreement`): how far each agent has learnt its habits.

Why these choices, with the measurements behind them: ``docs/learning.md`` ("The format
warm-up").
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from marl import seeds
from marl.algorithms.common import Trainable, guarded_step, sft_term, target_ids
from marl.algorithms.config import TrainConfig
from marl.errors import MarlError
from marl.policies import Completion, Policy, Request
from marl.policies.scripted import RandomPolicy, ScriptedPolicy
from marl.rollout import EpisodeBatch, collect
from marl.tasks.base import inbox_messages, private_text
from marl.team import Team


def source_episodes(team: Team, cfg: TrainConfig, habits: Habits, seed: int) -> EpisodeBatch:
    """``cfg.warmup_episodes`` instances played for every agent by the task's oracle
    (``oracle``), its random policy (``random`` with a ``uniform`` prior) or its random
    policy with habits (``random`` with ``habits``)."""
    player: Policy
    if cfg.warmup_source == "oracle":
        player = ScriptedPolicy(team.task)
    elif cfg.warmup_prior in ("habits", "ciphers"):
        player = HabitPolicy(team, habits, cfg.habit_strength, seed)
    else:
        player = RandomPolicy(team.task, seed)
    return collect(team, dict.fromkeys(team.ids, player), cfg.warmup_episodes, 1, seed=seed)


class Habits:
    """Each agent's habit for each observation it has met: a random message (or answer) of
    the task's format, drawn with a generator seeded by the run's seed, the agent and the
    observation, and distinct from the agent's other habits where the format leaves room
    (an agent does not give two different situations the same name; redrawn up to
    ``TRIES`` times).

    The table depends only on the seed and the order in which observations are met, which
    the warm-up's seeded episodes fix; it is saved with checkpoints for exact resume. With
    ``ciphers`` a habit is the agent's cipher of what it read where the task lines that
    up (:meth:`enciphered`), and otherwise drawn as above.
    """

    TRIES = 64

    def __init__(self, seed: int, table: dict[str, dict[str, str]] | None = None,
                 ciphers: bool = False, codes: dict[str, dict[str, str]] | None = None):
        self.seed = seed
        self.table: dict[str, dict[str, str]] = table or {}
        self.ciphers = ciphers
        #: ``ciphers``: symbols an agent writes for a symbol it read, by :func:`code_key`,
        #: in place of its random cipher (the team's own code, :func:`team_codes`).
        self.codes: dict[str, dict[str, str]] = codes or {}

    def message(self, team: Team, agent: str, observation: str, final: bool = False) -> str:
        """The habit of ``agent`` for ``observation`` (an answer when ``final``)."""
        mine = self.table.setdefault(agent, {})
        if observation not in mine:
            mine[observation] = self.peek(team, agent, observation, final)
        return mine[observation]

    def peek(self, team: Team, agent: str, observation: str, final: bool = False) -> str:
        """:meth:`message` without recording it: the habit ``agent`` has for
        ``observation``, or would be given now if it has none yet (so an evaluation can
        compare against habits without changing those drawn later)."""
        mine = self.table.get(agent, {})
        if observation in mine:
            return mine[observation]
        if self.ciphers and (text := self.enciphered(team, agent, observation, final)):
            return text
        used = set(mine.values())
        for attempt in range(self.TRIES):
            key = seeds.derive_seed(self.seed, seeds.HABITS, zlib.crc32(agent.encode()),
                                    zlib.crc32(observation.encode()), attempt)
            text = team.task.random_message(agent, final, np.random.default_rng(key))
            if text not in used:
                break
        return text


    def enciphered(self, team: Team, agent: str, observation: str, final: bool) -> str | None:
        """The ``ciphers`` prior's habit: each symbol of what ``agent`` read
        (:func:`read_symbols`) through the agent's cipher, a random permutation of
        that position's alphabet seeded by the run's seed, the agent, ``final`` and the
        alphabet, so one agent writes the same symbol for a symbol wherever it stands.
        An agent passing on a message it heard uses a cipher chosen by what it knows
        privately (:func:`read_fields`), so its own knowledge reaches the next agent too.
        Where :attr:`codes` has the agent's symbol for it, that symbol instead.
        ``None`` where nothing the agent read fits its output."""
        fields = read_fields(team, agent, observation, final)
        if fields is None:
            return None
        read, context = fields
        out = []
        for c, alphabet in zip(read, team.task.symbols(agent, final), strict=True):
            code = self.codes.get(code_key(agent, final, alphabet), {})
            if c in code:
                out.append(code[c])
                continue
            key = seeds.derive_seed(self.seed, seeds.HABITS, zlib.crc32(agent.encode()),
                                    int(final), zlib.crc32(alphabet.encode()),
                                    *([zlib.crc32(context.encode())] if context else []))
            order = np.random.default_rng(key).permutation(len(alphabet))
            out.append(alphabet[order[alphabet.index(c)]])
        return "".join(out)


def read_symbols(team: Team, agent: str, observation: str, final: bool) -> str | None:
    """What ``agent``'s message (or, when ``final``, answer) is *about*, one symbol per
    position: the first field of ``observation`` that fits the output's alphabets
    (:meth:`Task.symbols`: as many symbols, each from its position's alphabet), among the
    words of the agent's private text, then the messages it heard, in order. ``None``
    where none fits (or the task's outputs have no fixed alphabets). Any task with
    alphabets has it, through its observations alone; what it should become is never
    read."""
    fields = read_fields(team, agent, observation, final)
    return None if fields is None else fields[0]


def read_fields(team: Team, agent: str, observation: str,
                final: bool) -> tuple[str, str] | None:
    """:func:`read_symbols`' field and its *context*, which chooses the agent's cipher:
    where the field is a message the agent heard, what it knows itself (:func:`known`);
    ``""`` where the field is its own. Other messages it heard stay out, so an agent has
    as many ciphers as it has private observations, however many messages it hears."""
    alphabets = team.task.symbols(agent, final)
    if alphabets is None:
        return None
    own = private_text(observation).split()
    fields = own + [text for _, text in inbox_messages(observation, team.ids) if text]
    for i, f in enumerate(fields):
        if len(f) == len(alphabets) and all(
                c in alphabet for c, alphabet in zip(f, alphabets, strict=True)):
            return f, "" if i < len(own) else known(own)
    return None


def known(words: Sequence[str]) -> str:
    """What private ``words`` say, one per line: without field names (``value:``, the same
    in every observation) and ``?`` marks (nothing known). ``""`` for an agent that knows
    nothing, which so keeps one cipher, the same at every message length."""
    return "\n".join(w for w in (w.replace("?", "") for w in words)
                     if w and not w.endswith(":"))


def code_key(agent: str, final: bool, alphabet: str) -> str:
    """The key of one agent's code over one alphabet, for messages or answers."""
    return f"{agent}|{int(final)}|{alphabet}"


def team_codes(team: Team, batch: EpisodeBatch) -> dict[str, dict[str, str]]:
    """Each agent's code as its calls in ``batch`` show it, by :func:`code_key`: for each
    symbol it read (:func:`read_symbols`), the symbol it wrote most often in the same
    position (ties: the one written first), over all its ciphers. Calls whose message does
    not line up with what was read (another length, a symbol outside the alphabet) show
    nothing."""
    counts: dict[str, dict[str, Counter[str]]] = {}
    for b, record in enumerate(batch.records):
        for k, call in enumerate(record["transcript"]):
            agent = call["agent"]
            final = team.is_final_call(agent, call["round"])
            read = read_symbols(team, agent, batch.observations[b][k], final)
            alphabets = team.task.symbols(agent, final)
            said = call["message"]
            if read is None or len(said) != len(read):
                continue
            for c, s, alphabet in zip(read, said, alphabets, strict=True):
                if s in alphabet:
                    by = counts.setdefault(code_key(agent, final, alphabet), {})
                    by.setdefault(c, Counter())[s] += 1
    return {key: {c: n.most_common(1)[0][0] for c, n in by.items()}
            for key, by in counts.items()}


#: Backends whose models are pretrained: the format warm-up skips them by default.
PRETRAINED = ("hf", "vllm")


def warming(team: Team, cfg: TrainConfig) -> list[str]:
    """The policies the format warm-up trains: every model policy trained from scratch
    (``tiny``), and the pretrained ones (``hf``, ``vllm``) only with ``warmup_pretrained``
    (a pretrained model already writes well-formed text, which the warm-up would replace
    with the random policy's). None without a warm-up."""
    if not cfg.warmup:
        return []
    specs = team.scenario.policies.items()
    return [name for name, spec in specs
            if spec.backend == "tiny" or (spec.backend in PRETRAINED and cfg.warmup_pretrained)]


def check_prior(teams: Sequence[Team], cfg: TrainConfig) -> None:
    """Before training: what the warm-up and the SFT term play must exist for the task. The
    random warm-up needs the task's random policy and oracle demonstrations its oracle."""
    warm = bool(warming(teams[0], cfg))
    needs = {"random_message": warm and cfg.warmup_source == "random",
             "oracle": (warm and cfg.warmup_source == "oracle") or cfg.sft_coef > 0}
    for team in teams:
        task = team.task
        if needs["random_message"] and not task.provides("random_message"):
            raise MarlError(f"{task.id} has no random policy (Task.random_message), which the "
                            "format warm-up plays (warmup_source: random); set warmup_source: "
                            "none (a pretrained model needs no warm-up) or give the task a "
                            "random_message.")
        if needs["oracle"] and not task.provides("oracle"):
            raise MarlError(f"{task.id} has no scripted oracle (Task.oracle), which oracle "
                            "demonstrations need (sft_coef, warmup_source: oracle); train "
                            "from reward alone (sft_coef: 0, warmup_source: random or none).")


def habit_agreement(team: Team, batch: EpisodeBatch, habits: Habits) -> dict[str, float]:
    """Per agent, the share of its calls in ``batch`` whose message is its habit for what
    it read: near 1 once a greedy team has learnt its habits, and near chance while the
    warm-up has taught only the format (every agent then writes much the same whatever
    it read, and reward cannot reach it through its input)."""
    agrees = torch.zeros(len(batch.records), len(batch.call_agent), dtype=torch.bool)
    for b, record in enumerate(batch.records):
        for k, call in enumerate(record["transcript"]):
            final = team.is_final_call(call["agent"], call["round"])
            habit = habits.peek(team, call["agent"], batch.observations[b][k], final)
            agrees[b, k] = call["message"] == habit
    return batch.per_agent_rate(agrees)


class HabitPolicy(RandomPolicy):
    """The task's random policy with habits: with probability ``strength`` an agent says
    its habit for what it read, otherwise a fresh random message. Teammates hear each
    other's habits, so an agent meets (and forms habits for) the messages it will hear
    when RL starts, not every message of the format."""

    def __init__(self, team: Team, habits: Habits, strength: float, seed: int = 0):
        super().__init__(team.task, seed)
        self.team, self.habits, self.strength = team, habits, strength

    def generate(self, requests: Sequence[Request], greedy: bool = False) -> list[Completion]:
        out = []
        for r in requests:
            habit = self.rng.random() < self.strength
            # drawn either way, so later draws do not depend on earlier coins
            fresh = self.task.random_message(r.agent, r.final, self.rng)
            out.append(Completion(self.habits.message(self.team, r.agent, r.observation, r.final)
                                  if habit else fresh))
        return out


def warmup_rows(t: Trainable, team: Team, batch: EpisodeBatch,
                cfg: TrainConfig) -> tuple[list[tuple[int, ...]], list[list[int]]]:
    """Prompts and target ids of ``t``'s agents' calls in a source batch: what the source
    said (``oracle``: its demonstrations, skipping calls where it would only guess)."""
    prompts, targets = [], []
    tok = t.policy.tokenizer
    for k in batch.slots(t.agents).tolist():
        agent = batch.agents[int(batch.call_agent[k])]
        final = team.is_final_call(agent, int(batch.call_round[k]))
        for b, record in enumerate(batch.records):
            obs = batch.observations[b][k]
            text = (team.task.demonstration(agent, obs, final) if cfg.warmup_source == "oracle"
                    else record["transcript"][k]["message"])
            if text is None:
                continue
            prompts.append(tuple(tok.encode_prompt(obs)))
            targets.append(target_ids(t, text))
    return prompts, targets


def warmup_stage(step: int, stages: int, steps: int) -> int:
    """The curriculum stage whose team warm-up step ``step`` (of ``steps``) plays: stage
    ``k`` joins after ``k / stages`` of the warm-up, and the stages joined so far take
    turns, so the first stage is learnt alone before longer ones join it.

    >>> [warmup_stage(s, 3, 9) for s in range(9)]
    [0, 0, 0, 1, 0, 1, 0, 1, 2]
    """
    return step % stages_joined(step, stages, steps)


def stages_joined(step: int, stages: int, steps: int) -> int:
    """How many curriculum stages have joined the warm-up by step ``step`` (of ``steps``):
    stage ``k`` joins after ``k / stages`` of it.

    >>> [stages_joined(s, 3, 9) for s in (0, 3, 6)]
    [1, 2, 3]
    """
    return min(stages, step * stages // max(steps, 1) + 1)


def warmup_step(trainables: Sequence[Trainable], teams: Sequence[Team], cfg: TrainConfig,
                step: int, habits: Habits, seed: int | None = None
                ) -> tuple[dict[str, float], EpisodeBatch]:
    """One optimizer step per trainable policy on a fresh source batch (its episodes
    seeded by ``seed``, by default the warm-up's for ``step``); returns the mean and the
    largest SFT loss of the policies (``sft_loss``, ``sft_loss_max``), the guard's
    counters, and the batch."""
    team = teams[warmup_stage(step, len(teams), cfg.warmup)]
    if seed is None:
        seed = seeds.derive_seed(cfg.seed, seeds.WARMUP, step)
    batch = source_episodes(team, cfg, habits, seed)
    stats: dict[str, float] = {"sft_loss": 0.0, "sft_loss_max": 0.0, "grad_norm": 0.0,
                               "skipped": 0.0}
    for loss, out in sft_steps(trainables, team, batch, cfg).values():
        stats["sft_loss"] += loss / len(trainables)
        stats["sft_loss_max"] = max(stats["sft_loss_max"], loss)
        stats["grad_norm"] += out["grad_norm"] / len(trainables)
        stats["skipped"] += out["skipped"]
    return stats, batch


def learnt(step: int, stages: int, steps: int, loss_max: float, below: int) -> int:
    """Steps in a row, up to warm-up step ``step`` (of at most ``steps``, counted from 0),
    in which every policy followed what the source plays: its SFT loss below
    :data:`CARRIED` nats a token, with every curriculum stage joined (:func:`stages_joined`);
    ``below`` is the count before this step. With ``warmup_until_learnt`` the warm-up ends
    at :data:`SETTLED_STEPS`: more steps of the same targets teach nothing new, and RL
    gets their time.

    >>> [learnt(s, 1, 600, 0.005, s) for s in range(3)]
    [1, 2, 3]
    >>> learnt(5, 1, 600, 0.2, 5), learnt(0, 2, 600, 0.005, 0)  # a stage has not joined
    (0, 0)
    """
    joined = stages_joined(step, stages, steps) == stages
    return below + 1 if joined and loss_max < CARRIED else 0


def sft_steps(trainables: Sequence[Trainable], team: Team, batch: EpisodeBatch,
              cfg: TrainConfig) -> dict[str, tuple[float, dict]]:
    """One supervised step per trainable policy on a source batch's calls of its agents:
    its SFT loss and the guard's output, by policy name (policies with no call left out)."""
    done = {}
    for t in trainables:
        prompts, targets = warmup_rows(t, team, batch, cfg)
        if prompts:
            loss = sft_term(t, prompts, targets)
            done[t.name] = (float(loss.detach()), guarded_step(t, loss, cfg))
    return done


#: Greedy episodes of the stage just passed that show :func:`promotion_warmup` the team's
#: code (26 one-letter facts: each seen about ten times).
CODE_EPISODES = 256


#: A policy follows its targets once its SFT loss stayed below CARRIED nats a token for
#: SETTLED_STEPS steps in a row: the warm-up then ends (:func:`learnt`), and a policy
#: carrying its code on promotion takes no more steps.
CARRIED = 0.01
SETTLED_STEPS = 10


def promotion_warmup(trainables: Sequence[Trainable], passed: Team, team: Team,
                     policies: dict[str, Policy], cfg: TrainConfig, stage: int
                     ) -> dict[str, float]:
    """Up to ``cfg.promotion_warmup`` supervised steps per policy on ``team``, the
    curriculum stage ``stage`` just reached, whose targets are each agent's *own* code:
    what it wrote for each symbol it read on ``passed`` (the stage left,
    :data:`CODE_EPISODES` greedy episodes, :func:`team_codes`), applied symbol by symbol
    (the ``ciphers`` prior's rule; symbols the episodes do not show keep the agent's
    warm-up cipher). The code was learnt from reward; these steps carry it to the longer
    messages of the next stage, which RL on the stage passed left untouched or garbled (a
    tiny model does not extend it by itself). A policy stops once it follows its code
    (loss below :data:`CARRIED` for :data:`SETTLED_STEPS` steps): a policy that has learnt
    little since the warm-up settles within tens of steps, one whose map RL rewrote may
    take a thousand (``docs/learning.md``). Returns the steps of the policy that took most,
    the first and last steps' mean SFT loss (each policy's last step counted), how many
    policies settled and their steps by name (``steps_<name>``), the symbols the codes
    cover and the guard's count of skipped updates."""
    seed = seeds.derive_seed(cfg.seed, seeds.PROMOTION, stage)
    shown = collect(passed, policies, CODE_EPISODES, 1, seed=seed, greedy=True)
    codes = team_codes(passed, shown)
    habits = Habits(cfg.seed, ciphers=True, codes=codes)
    active = list(trainables)
    last: dict[str, float] = {}
    below: Counter[str] = Counter()
    taken: Counter[str] = Counter()
    first, skipped, step = None, 0.0, 0
    while active and step < cfg.promotion_warmup:
        batch = source_episodes(team, cfg, habits,
                                seeds.derive_seed(cfg.seed, seeds.PROMOTION, stage, step))
        for name, (loss, out) in sft_steps(active, team, batch, cfg).items():
            last[name] = loss
            taken[name] += 1
            skipped += out["skipped"]
            below[name] = below[name] + 1 if loss < CARRIED else 0
        if first is None:
            first = sum(last.values()) / max(len(last), 1)
        active = [t for t in active if below[t.name] < SETTLED_STEPS]
        step += 1
    settled = [t.name for t in trainables if below[t.name] >= SETTLED_STEPS]
    return {"steps": float(step), "sft_loss_first": first or 0.0,
            "sft_loss_last": sum(last.values()) / max(len(last), 1),
            "settled": float(len(settled)),
            **{f"steps_{t.name}": float(taken[t.name]) for t in trainables},
            "code_symbols": float(sum(len(c) for c in codes.values())), "skipped": skipped}


def carried_text(out: dict[str, float]) -> str:
    """What :func:`promotion_warmup` did, in words for the training log."""
    skipped = (f", {out['skipped']:.0f} of them skipped (non-finite loss or gradient)"
               if out["skipped"] else "")
    taken = ", ".join(f"{key.removeprefix('steps_')} {value:.0f}" for key, value in out.items()
                      if key.startswith("steps_"))
    policies = sum(key.startswith("steps_") for key in out)
    return (f"supervised steps on the team's own code ({out['code_symbols']:.0f} symbols) "
            f"by policy: {taken} ({out['settled']:.0f} of {policies} followed it), SFT loss "
            f"{out['sft_loss_first']:.3f} -> {out['sft_loss_last']:.3f}{skipped}")
