"""Training configuration: one typed object, from defaults, a YAML file of overrides
(``configs/algorithm/*.yaml``) and ``--set key=value``, validated strictly."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from marl.overrides import load_settings


class Stage(BaseModel):
    """One stage of a curriculum: scenario overrides and when to move on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(None, description="Label in metrics rows (default: stage_N).")
    task: dict[str, Any] = Field(default_factory=dict,
                                 description="Overrides of the scenario's task.params.")
    scenario: dict[str, Any] = Field(
        default_factory=dict, description="Other scenario keys, merged into the scenario "
        "(e.g. {protocol: {rounds: 2}}); agents and policies must stay the same.")
    promote_at: float | None = Field(None, gt=0, le=1, description="Move on once the eval "
                                     "success rate reaches this.")
    after: int | None = Field(None, ge=1, description="Move on after this many iterations "
                              "in the stage.")


class TrainConfig(BaseModel):
    """Every training setting. Defaults train ``scenarios/signal.yaml`` to its target."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: Literal["magrpo", "grpo", "ppo"] = Field(
        "magrpo", description="magrpo: joint groups, shared team return; grpo: independent "
                              "per-agent groups and returns; ppo: value head and GAE.")
    iterations: int = Field(1200, ge=1, description="RL iterations (after the warm-up).")
    time_budget_s: float | None = Field(None, gt=0, description="Stop after this many "
                                                                  "seconds of training.")
    target_success: float | None = Field(
        None, ge=0, le=1, description="Stop once the eval success rate reaches this.")
    seed: int = Field(0, ge=0, description="Seed of instances, sampling and initialisation.")
    episodes_per_iter: int = Field(16, ge=1, description="Task instances per iteration.")
    group_size: int = Field(8, ge=1, description="Joint rollouts of each instance (G).")
    baseline: Literal["mean", "mean_std", "loo", "max"] = Field(
        "mean", description="Group baseline (mean: MAGRPO / Dr. GRPO; mean_std: GRPO; loo: "
                            "RLOO; max: ReMax).")
    credit: Literal["team", "difference", "shapley", "anchor"] = Field(
        "team", description="team: every agent gets the team advantage; difference / shapley: "
        "per-agent credit from counterfactual replays with agents muted; anchor: per call, "
        "the batch's mean return of the agent's calls with the same observation and message "
        "minus that of its calls with the same observation (Q(o, m) − V(o), GiGPO's anchor "
        "states; baseline mean_std divides by the observation's std of returns), so an "
        "agent is credited for its own choice and a teammate's lucky choice moves it little.")
    turns: int = Field(
        0, ge=0, description="Policies learn in turns (block-coordinate ascent, iterated best "
        "response): for this many RL iterations only one policy is updated while its "
        "teammates play unchanged, then the next in turn_order, round and round. Learners "
        "that all move at once can undo each other (on relay_chain two facts end up sharing "
        "a letter at some hop, and neither can be told apart again); one learner against "
        "fixed teammates meets a stationary problem. 0 (default): every policy learns every "
        "iteration.")
    turn_order: list[str] = Field(
        default_factory=list, description="Policy names in the order they take turns (every "
        "trainable policy once); empty: the scenario's policies from last to first (in a "
        "chain, the answerer first).")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate.")
    adam_eps: float = Field(
        1e-8, gt=0, description="Adam's epsilon while a team learns (added to the root of "
        "its second-moment estimate). 1e-4 from the start held solved teams as well as "
        "settle_at, but slowed learning where the gradients that matter are small: ref.yaml "
        "reached 0.89 in 20 minutes instead of 1.0 after 371 s.")
    adam_beta2: float = Field(
        0.999, gt=0, lt=1, description="Adam's second-moment decay. 0.9999 (a second moment "
        "that remembers the gradients of learning, so later small ones take small steps) "
        "was measured on the main job, seeds 0, 1, 3: 1, 49 and 0 evaluations below 0.95 "
        "after solving; settle_at did better.")
    settle_at: float | None = Field(
        0.95, gt=0, le=1, description="A team that evaluates at this success rate or better "
        "is settled: from then on (until the next curriculum stage) Adam's epsilon is "
        "settled_eps. Nothing changes before, so learning is as fast as without it. None: "
        "never. Why: once a team is solved most groups have no policy gradient and the "
        "rest give small ones (norm 0.01-0.1, about 2e-5 per parameter on the tiny "
        "preset); Adam scales each step by the root of its second moment, so with eps "
        "1e-8 every parameter still moves by about lr per step whatever its gradient's "
        "size, and solved teams drifted and fell. Measured on the main job over 1,200 "
        "iterations, seeds 0-4 on one thread each (README, 'What the defaults learn "
        "from'): no evaluation below 0.95 after solving (1, 2, 2, 0 and 0 with "
        "settled_eps 1e-4), all ending at 1.0; without it 29, 9, 13, 33 and 15, two "
        "ending near 0.5.")
    settled_eps: float = Field(
        1e-3, gt=0, description="settle_at: Adam's epsilon once settled. Far above the "
        "root of a solved team's second moment, it turns Adam into SGD with momentum at a "
        "learning rate of lr / settled_eps (1 with the defaults): a gradient then moves "
        "parameters in proportion to its size, so small ones barely move a solved team "
        "while the larger ones of failures still correct it. With 1e-4 (learning rate 10) "
        "a single update of gradient norm 0.28 started a fall on the main job (two "
        "threads: 5 evaluations below 0.95, lowest 0.48); with 1e-3 no seed of 0-4 fell.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    epochs: int = Field(1, ge=1, description="Passes over each batch (1: MAGRPO's on-policy "
                        "step; more reuse each batch, clipped, and were seen to collapse a "
                        "team learning from reward alone).")
    minibatches: int = Field(1, ge=1, description="Minibatches per pass.")
    clip_low: float = Field(0.2, ge=0, description="Ratio clip below 1 (1 - clip_low).")
    clip_high: float = Field(0.28, ge=0, description="Ratio clip above 1 (clip-higher).")
    kl_coef: float = Field(0.1, ge=0, description="Exact KL(π || π_ref) over the vocabulary at "
                           "every generated token, to a reference: the policy RL started "
                           "from (after the warm-up), or, with kl_reset_at, renewed when "
                           "the team evaluates well. It keeps the format the warm-up taught "
                           "and stops a policy from collapsing onto one message while it "
                           "explores.")
    kl_reset_at: float | None = Field(
        None, gt=0, le=1, description="A team that evaluates at this success rate or better, "
        "kl_reset_every iterations or more after the KL term's reference was last set, is "
        "held where it is: the reference becomes the current policy (a reference reset, as "
        "in ProRL, triggered by success). None (default): the reference stays the policy RL "
        "started from, whose pull towards each agent's warm-up habits can flip a solved "
        "team's answers back to them. Measured on the main job over 1,200 iterations with "
        "0.95 and entropy_target 0.3 (README, 'What the defaults learn from'): seeds 0-4 on "
        "one thread each dipped below 0.95 in 0, 4, 0, 0 and 0 evaluations after solving "
        "(29, 9, 13, 33 and 15 without it); on two threads seed 0 in none (4 without it) and "
        "seed 1 in 9, ending at 0.75 (none without it); on earlier code, with other "
        "rounding, seed 0 on two threads fell at iteration 460 and ended at 0.52. Alone, "
        "without entropy_target, each reset renews the reference where the entropy bonus "
        "has pushed the policy: entropy rose to 1.9 nats and messages lengthened.")
    kl_reset_every: int = Field(
        50, ge=1, description="kl_reset_at: fewest iterations between two reference resets "
        "(and from the start of RL to the first). A reference only a few iterations old no "
        "longer holds a team anywhere: resetting at every good evaluation let solved teams "
        "drift (signal seed 0: 0.47-0.73 for the last 240 of 1,200 iterations).")
    kl_reset_on_promotion: bool = Field(
        True, description="curriculum: when the team is promoted to the next stage, the "
        "KL term's reference becomes the promoted policy, so the term holds what the "
        "earlier stages taught (false: the reference stays the policy RL started from, "
        "which pulls every later stage back towards the warm-up's habits and undoes the "
        "conventions the earlier stages found).")
    regularize_solved: bool = Field(
        True, description="magrpo, grpo: apply the KL and entropy terms to samples whose "
        "group succeeded in every rollout (no policy gradient left there). With false they "
        "are skipped there; measured on signal seed 0 that kept a solved team from the "
        "eval drops seen with true (1.0 to 0.0 for 20 iterations at 550, 0.48 at 900) "
        "except for single evaluations at 0.73, but lewis with 8 objects was slower (0.86 "
        "after 1,100 iterations instead of 1.0 after 610).")
    entropy_coef: float = Field(0.05, ge=0, description="Entropy bonus (per token, full "
                                "vocabulary). It keeps a policy exploring after it has "
                                "settled: on lewis with 8 objects, without it the listener "
                                "became certain of wrong answers (p = 1.0) and the team "
                                "stayed at 0.73; with 0.05 it reached 1.0.")
    entropy_target: float | None = Field(
        None, gt=0, description="The entropy bonus applies only to tokens whose entropy "
        "(nats, full vocabulary) is below this: a floor that keeps an agent exploring "
        "without pushing a settled one towards ill-formed messages. None (default): every "
        "token. Measured with 0.3 on the main job over 1,200 iterations, seeds 0-2: 20 "
        "evaluations below 0.95 after solving instead of 40 or more, lowest 0.67 instead "
        "of 0.44, but seed 2 (never below 0.95 without it) dipped 6 times; lewis with 8 "
        "objects reached 1.0 after 520 iterations.")
    symbol_floor: float = Field(
        0.0, ge=0, description="Weight of a term that raises the mean log-probability of "
        "the task's alphabet at each generated symbol (Task.symbols; every symbol must be "
        "one token): it keeps every well-formed choice alive. The entropy bonus and the "
        "KL term cannot revive a choice a policy has all but dropped, since their gradient "
        "on a token's logit vanishes with its probability; this one's is p - 1/|alphabet|. "
        "On lewis with 8 objects, seed 0, whose listener without answer_floor answers 3 "
        "to no letter (p < 0.0005) and stays at 0.89, 0.01 reached 1.0 after 420 "
        "iterations; on signal and lewis seeds where the defaults succeed it was slower "
        "(README, Status), as it also pulls a solved answer towards the others. 0 "
        "(default): off.")
    answer_floor: float = Field(
        0.1, ge=0, lt=1, description="Keeps every answer the team can give in use: a term "
        "lifts each symbol of an answer's alphabet (Task.symbols; one token per symbol; "
        "answers without one are skipped, as the trainer says at start) whose probability, "
        "averaged over the batch's answers, is below answer_floor times its share "
        "1/|alphabet|. It is 0, with no gradient, while every symbol is given at least that "
        "often (as in a solved team whose targets are uniform), so unlike symbol_floor it "
        "does not pull a solved answer towards the others (a symbol that is never right is "
        "kept at the floor). On lewis with 8 objects, seed 0, "
        "whose listener without it stops answering 3 and stays at 0.89, it first acted at "
        "iteration 84 and the team reached 1.0 at 530 (README, Status). 0: off.")
    signal_entropy: float = Field(
        0.0, ge=0, description="Weight of a positive-signalling bonus (Eccles et al., 2019): "
        "the entropy of each agent's symbols averaged over the batch's calls, per position "
        "and alphabet (Task.symbols; one token per symbol), so an agent keeps saying different "
        "things for different inputs: a relay that starts writing one letter for two facts "
        "loses this entropy, and the term pushes the second back towards a letter no fact "
        "uses. Unlike the entropy bonus it does not reward a call for being unsure. "
        "0 (default): off.")
    aggregation: Literal["token", "sequence"] = Field(
        "token", description="token: mean over all tokens; sequence: mean of per-sequence means.")
    sft_coef: float = Field(0.0, ge=0, description="L = L_RL + sft_coef * L_SFT on the task "
                            "oracle's demonstrations. 0 (default): pure RL; any other value "
                            "imitates the oracle and labels the run uses_oracle.")
    sft_decay: float = Field(1.0, gt=0, le=1, description="sft_coef is multiplied by this "
                                                          "after each iteration.")
    warmup_source: Literal["random", "oracle", "none"] = Field(
        "random", description="Format warm-up before RL: supervised steps on the messages of "
        "the task's random policy (random: the form of every message and answer, nothing "
        "about meaning), of its oracle (oracle: imitation, labels the run uses_oracle), or "
        "none.")
    warmup_prior: Literal["habits", "ciphers", "uniform"] = Field(
        "habits", description="random warm-up: habits (each agent learns, for every "
        "observation, one random message or answer of the task's format, drawn with a seed of "
        "the run, the agent and the observation: arbitrary habits in how it talks and "
        "answers, shared with no teammate), ciphers (a habit is what the agent read, symbol "
        "by symbol, through a private random cipher of its own; for tasks that line their "
        "messages up with what was read, e.g. relay_v0) or uniform (a fresh random message "
        "every time: messages independent of what the agent read).")
    habit_strength: float = Field(
        0.75, gt=0, le=1, description="habits and ciphers: how often an agent says its habit in "
        "the "
        "warm-up's episodes (otherwise a fresh random message), so a habit is a strong "
        "preference, not a certainty, and can still be unlearnt.")
    warmup_steps: int = Field(200, ge=0, description="Optimizer steps of the warm-up.")
    promotion_warmup: int = Field(
        0, ge=0, description="curriculum with warmup_prior: ciphers: on each promotion, up to "
        "this many supervised steps per policy on the next stage whose targets are every "
        "agent's own code on the stage passed (what it wrote for each symbol it read, learnt "
        "from reward), applied symbol by symbol to the next stage's longer messages; a policy "
        "stops once it follows its code (SFT loss below 0.01 nats a token for 10 steps in a "
        "row). 0: none.")
    warmup_episodes: int = Field(32, ge=1, description="Episodes the warm-up source plays "
                                 "per step (every call of a trainable agent is a target).")
    curriculum: list[Stage] = Field(
        default_factory=list, description="Stages of task / scenario overrides, each with a "
        "promotion rule; empty: the scenario as written.")
    demo_episodes: int = Field(0, ge=0, description="Extra task instances per iteration "
                               "played by the task oracle alone; every call in them is a "
                               "demonstration for the SFT term (behaviour cloning on clean "
                               "inputs). 0: demonstrations only on what the team itself saw.")
    value_coef: float = Field(0.5, ge=0, description="ppo: value loss weight.")
    gamma: float = Field(1.0, ge=0, le=1, description="ppo: discount per token.")
    lam: float = Field(0.95, ge=0, le=1, description="ppo: GAE lambda.")
    critic: Literal["independent", "central"] = Field(
        "independent", description="ppo: a value head per policy (IPPO) or one critic over "
                                   "the joint transcript (MAPPO).")
    eval_every: int = Field(10, ge=1, description="Evaluate every K iterations (greedy).")
    eval_episodes: int = Field(64, ge=1, description="Held-out instances per evaluation.")
    checkpoint_every: int = Field(10, ge=1, description="Checkpoint every K iterations (and "
                                  "every K warm-up steps).")
    checkpoint_every_s: float = Field(300.0, gt=0, description="Checkpoint at least this "
                                      "often, in seconds of training.")
    keep_checkpoints: int = Field(3, ge=1, description="Checkpoints kept (plus best).")
    max_bad_iterations: int = Field(5, ge=1, description="Stop after this many consecutive "
                                    "iterations with a skipped (non-finite) update.")
    transcripts_per_iter: int = Field(2, ge=0, description="Episodes written to "
                                      "episodes/iter_N.jsonl per iteration.")
    wandb: bool = Field(False, description="Log to Weights & Biases (offline without a key).")
    wandb_project: str = Field("llm-marl", description="wandb project.")

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.group_size < 2 and self.algorithm != "ppo":
            raise ValueError(f"group_size={self.group_size}: {self.algorithm} compares "
                             "rollouts within a group, so group_size must be at least 2.")
        self._check_applies()
        for i, stage in enumerate(self.curriculum):
            last = i == len(self.curriculum) - 1
            rule = stage.promote_at is not None or stage.after is not None
            if not last and not rule:
                raise ValueError(f"curriculum[{i}] has no promotion rule: give it promote_at "
                                 "(an eval success rate) or after (iterations).")
            if last and rule:
                raise ValueError(f"curriculum[{i}] is the last stage, so it is never left: "
                                 "remove its promote_at / after.")
        return self

    def _check_applies(self) -> None:
        """A setting the chosen algorithm ignores, changed from its default, is an error, not
        a silent no-op (defaults pass, so a fully resolved config.yaml loads again)."""
        fields = type(self).model_fields
        changed = {k for k in self.model_fields_set if getattr(self, k) != fields[k].default}
        ppo_only = sorted(changed & {"value_coef", "gamma", "lam", "critic"})
        group_only = sorted(changed & {"baseline", "credit", "regularize_solved"})
        if self.algorithm != "ppo" and ppo_only:
            raise ValueError(f"{', '.join(ppo_only)} only apply to algorithm: ppo (its critic "
                             f"and GAE); {self.algorithm} ignores them. Remove them or set "
                             "algorithm: ppo.")
        if self.algorithm == "ppo" and group_only:
            raise ValueError(f"{', '.join(group_only)} only apply to algorithms magrpo and "
                             "grpo (group baselines and counterfactual credit); ppo's critic "
                             "assigns credit. Remove them or choose magrpo or grpo.")
        if self.credit == "anchor" and self.baseline not in ("mean", "mean_std"):
            raise ValueError(f"baseline={self.baseline} with credit: anchor: anchor credit "
                             "compares an action's mean return with its observation's, so "
                             "the baseline must be mean or mean_std.")
        if "kl_reset_every" in changed and self.kl_reset_at is None:
            raise ValueError(f"kl_reset_every={self.kl_reset_every} spaces the reference "
                             "resets that kl_reset_at triggers, and kl_reset_at is null; set "
                             "kl_reset_at (e.g. 0.95) or drop kl_reset_every.")
        if "settled_eps" in changed and self.settle_at is None:
            raise ValueError(f"settled_eps={self.settled_eps} is Adam's epsilon once a team "
                             "evaluates at settle_at, and settle_at is null; set settle_at "
                             "(e.g. 0.95) or drop settled_eps.")
        if "kl_reset_on_promotion" in changed and not self.curriculum:
            raise ValueError("kl_reset_on_promotion renews the KL term's reference when a "
                             "curriculum stage is left, and there is no curriculum; add "
                             "curriculum stages or drop kl_reset_on_promotion.")
        if self.kl_reset_at is not None and self.kl_coef == 0:
            raise ValueError(f"kl_reset_at={self.kl_reset_at} resets the KL term's reference, "
                             "and kl_coef=0 switches that term off; set kl_coef > 0 or drop "
                             "kl_reset_at.")
        if self.demo_episodes and not self.sft_coef:
            raise ValueError(f"demo_episodes={self.demo_episodes} adds oracle-played "
                             "demonstrations to the SFT term, which sft_coef=0 switches off; "
                             "set sft_coef > 0 or drop demo_episodes.")
        warm = changed & {"warmup_steps", "warmup_episodes", "warmup_prior", "habit_strength"}
        if self.warmup_source == "none" and warm:
            raise ValueError(f"{', '.join(sorted(warm))} have no effect with warmup_source: "
                             "none; remove them or choose a warm-up source.")
        shaping = changed & {"warmup_prior", "habit_strength"}
        if self.warmup_source == "oracle" and shaping:
            raise ValueError(f"{', '.join(sorted(shaping))} shape the random policy's "
                             "messages; the oracle warm-up imitates the oracle. Remove them "
                             "or use warmup_source: random.")
        if self.turn_order and not self.turns:
            raise ValueError("turn_order orders the policies' turns, and there are none: set "
                             "turns (iterations per turn) or drop turn_order.")
        if self.promotion_warmup and not (self.warmup_source == "random"
                                          and self.warmup_prior == "ciphers"
                                          and self.curriculum):
            raise ValueError(f"promotion_warmup={self.promotion_warmup} carries a team's code "
                             "from one curriculum stage to the next with the ciphers prior's "
                             "rule; it needs a curriculum, warmup_source: random and "
                             "warmup_prior: ciphers. Set those or drop promotion_warmup.")
        if self.warmup_prior == "uniform" and "habit_strength" in changed:
            raise ValueError("habit_strength applies to warmup_prior: habits; remove it or "
                             "set warmup_prior: habits.")

    @property
    def uses_oracle(self) -> bool:
        """Whether anything learnt comes from the task oracle (imitation, not discovery)."""
        return self.sft_coef > 0 or (self.warmup_source == "oracle" and self.warmup_steps > 0)

    @property
    def warmup(self) -> int:
        """Warm-up steps that will run (0 with ``warmup_source: none``)."""
        return 0 if self.warmup_source == "none" else self.warmup_steps


def load_config(path: str | Path | None = None, sets: list[str] | None = None) -> TrainConfig:
    """Defaults, then the YAML file's overrides, then ``key=value`` overrides."""
    return load_settings(TrainConfig, "training config", path, sets)
