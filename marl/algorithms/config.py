"""Training configuration: one typed object, from defaults, a YAML file of overrides
(``configs/algorithm/*.yaml``) and ``--set key=value``, validated strictly."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

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


#: Settings that were removed: their old default and what to do instead.
REMOVED: dict[str, tuple[Any, str]] = {
    "symbol_floor": (0.0, "answer_floor (a default) keeps a dead answer alive without "
                     "pulling solved ones towards the others, and the generality suite "
                     "showed no gain from it (docs/learning.md, section 2.5)"),
}


class TrainConfig(BaseModel):
    """Every training setting of ``marl train``: the defaults are one recipe for any team.
    Why each default is what it is, with the measurements: ``docs/learning.md``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: Literal["magrpo", "grpo", "ppo"] = Field(
        "magrpo", description="magrpo: joint groups, shared team return; grpo: independent "
                              "per-agent groups and returns; ppo: value head and GAE.")
    iterations: int = Field(1200, ge=1, description="RL iterations (after the warm-up).")
    time_budget_s: float | None = Field(None, gt=0, description="Stop after this many "
                                                                  "seconds of training.")
    target_success: float | None = Field(
        None, ge=0, le=1, description="Stop once the eval success rate (of the last curriculum "
        "stage) reaches this.")
    seed: int = Field(0, ge=0, description="Seed of instances, sampling and initialisation.")
    episodes_per_iter: int = Field(16, ge=1, description="Task instances per iteration.")
    group_size: int = Field(8, ge=1, description="Joint rollouts of each instance (G).")
    baseline: Literal["mean", "mean_std", "loo", "max"] = Field(
        "mean", description="Group baseline (mean: MAGRPO / Dr. GRPO; mean_std: GRPO; loo: "
                            "RLOO; max: ReMax).")
    credit: Literal["team", "difference", "shapley", "anchor"] = Field(
        "team", description="team: every agent gets the team advantage; difference / shapley: "
        "per-agent credit from replays with agents muted; anchor: per call Q(o, m) - V(o) from "
        "the batch's calls with the same observation (GiGPO's anchor states).")
    advantage_scale: Literal["none", "agent"] = Field(
        "none", description="agent: divide each agent's advantages by the standard deviation "
        "of its returns over the batch (Dr.MAS), so rare successes weigh as much as common "
        "ones against the entropy and KL terms; none: as the baseline leaves them.")
    turns: int = Field(
        0, ge=0, description="Policies learn in turns: for this many RL iterations one policy "
        "is updated while the others play unchanged, then the next (iterated best response). "
        "0: every policy learns every iteration.")
    turn_order: list[str] = Field(
        default_factory=list, description="turns: policy names in the order they take turns "
        "(each trainable policy once); empty: the scenario's policies from last to first.")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate.")
    lr_patience: int | None = Field(
        10, ge=1, description="After this many evaluations in a row without a new best eval "
        "success in the curriculum stage, every learning rate is multiplied by lr_decay "
        "(ReduceLROnPlateau's rule: a schedule driven by measured progress; a league's "
        "players, which have no evaluations, keep lr). None: constant.")
    lr_decay: float = Field(0.5, gt=0, lt=1, description="lr_patience: the factor each "
                          "plateau multiplies the learning rate by.")
    lr_floor: float = Field(0.1, gt=0, le=1, description="lr_patience: the lowest learning "
                            "rate, as a fraction of lr.")
    adam_eps: float = Field(1e-8, gt=0, description="Adam's epsilon while a team learns.")
    adam_beta2: float = Field(0.999, gt=0, lt=1, description="Adam's second-moment decay.")
    settle_at: float | None = Field(
        0.95, gt=0, le=1, description="Once the team evaluates at this success rate, Adam's "
        "epsilon becomes settled_eps until the next curriculum stage, so small gradients "
        "barely move a solved team. None: never.")
    settled_eps: float = Field(
        1e-3, gt=0, description="settle_at: Adam's epsilon once settled (Adam then acts as SGD "
        "with momentum at learning rate lr / settled_eps).")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    epochs: int = Field(1, ge=1, description="Passes over each batch (1: an on-policy step; "
                        "more reuse each batch, clipped).")
    minibatches: int = Field(1, ge=1, description="Minibatches per pass.")
    clip_low: float = Field(0.2, ge=0, description="Ratio clip below 1 (1 - clip_low).")
    clip_high: float = Field(0.28, ge=0, description="Ratio clip above 1 (clip-higher).")
    kl_coef: float = Field(0.1, ge=0, description="Weight of the exact KL(π || π_ref) over the "
                           "vocabulary at every generated token; the reference is the policy RL "
                           "started from, renewed by kl_reset_at and on promotion.")
    kl_reset_at: float | None = Field(
        None, gt=0, le=1, description="When the team evaluates at this success rate, "
        "kl_reset_every iterations or more after the last reset, the KL reference becomes the "
        "current policy (ProRL's reference reset). None: never.")
    kl_reset_every: int = Field(
        50, ge=1, description="kl_reset_at: fewest iterations between two reference resets "
        "(and from the start of RL to the first).")
    kl_reset_on_promotion: bool = Field(
        True, description="curriculum: on promotion the KL reference becomes the promoted "
        "policy, so later stages are held near what earlier ones learnt.")
    regularize_solved: bool = Field(
        True, description="magrpo, grpo: apply the KL and entropy terms to samples whose group "
        "succeeded in every rollout (false: skip them there).")
    entropy_coef: float = Field(0.05, ge=0, description="Weight of the entropy bonus (per "
                                "token, nats, full vocabulary).")
    entropy_target: float | None = Field(
        0.3, gt=0, description="The entropy bonus applies only to tokens whose entropy (nats) "
        "is below this: a floor against collapse, not a push that outweighs rare successes. "
        "None: to every token.")
    influence_coef: float = Field(0.0, ge=0, description="Weight of the input-influence "
                                  "bonus (positive listening): the total variation between "
                                  "an agent's token distributions on what it read and on "
                                  "another task instance's observation.")
    answer_feedback: Literal["sampled", "full"] = Field(
        "full", description="full: an answer is told the team's score of every answer it "
        "could have given (Task.symbols; scored by the task, never the oracle) and maximises "
        "the log of its expected score over them, as referential games train receivers, "
        "and its KL term counts the alphabet as one outcome (it keeps the format, the scores "
        "say which symbol); answers without alphabets learn from the sampled reward. sampled: "
        "from the reward of the answer given alone.")
    answer_floor: float = Field(
        0.1, ge=0, lt=1, description="Lifts any answer symbol given, averaged over the batch's "
        "answers, less than this fraction of its share 1/|alphabet| (Task.symbols). 0: off.")
    signal_entropy: float = Field(
        0.0, ge=0, description="Weight of a positive-signalling bonus: the entropy of each "
        "agent's symbols over the batch's calls, per position (Eccles et al., 2019). 0: off.")
    aggregation: Literal["token", "sequence"] = Field(
        "token", description="token: mean over all tokens; sequence: mean of per-sequence means.")
    sft_coef: float = Field(0.0, ge=0, description="L = L_RL + sft_coef * L_SFT on the task "
                            "oracle's demonstrations. Any value but 0 imitates the oracle and "
                            "labels the run uses_oracle.")
    sft_decay: float = Field(1.0, gt=0, le=1, description="sft_coef is multiplied by this "
                                                          "after each iteration.")
    warmup_source: Literal["random", "oracle", "none"] = Field(
        "random", description="Format warm-up before RL, on the messages of the task's random "
        "policy (form without meaning), of its oracle (imitation: labels the run "
        "uses_oracle), or none.")
    warmup_prior: Literal["habits", "ciphers", "uniform"] = Field(
        "ciphers", description="random warm-up: ciphers (what the agent read through a "
        "private cipher, where a field of its observation fits its output's alphabets; "
        "a message it passes on through a cipher chosen by what it knows; elsewhere a "
        "habit), habits (an arbitrary message per agent and observation) or "
        "uniform (a fresh random message every time).")
    habit_strength: float = Field(
        1.0, gt=0, le=1, description="habits, ciphers: probability that an agent says its "
        "habit in the warm-up's episodes (else a fresh random message).")
    warmup_steps: int = Field(600, ge=0, description="Optimizer steps of the warm-up (at "
                              "most, with warmup_until_learnt).")
    warmup_until_learnt: bool = Field(
        False, description="End the warm-up once every policy has followed what its source "
        "plays for 10 steps in a row (SFT loss below 0.01 nats a token); off: all "
        "warmup_steps run (the suite's figure: docs/learning.md, section 1.7).")
    warmup_pretrained: bool = Field(
        False, description="Also warm up hf and vllm policies (pretrained models already "
        "write well-formed text; by default only tiny models, trained from scratch, do).")
    promotion_warmup: int = Field(
        0, ge=0, description="curriculum with ciphers: on promotion, at most this many "
        "supervised steps per policy teaching each agent its own learnt code on the next "
        "stage's messages; a policy stops once it follows it. 0: none.")
    warmup_episodes: int = Field(32, ge=1, description="Episodes the warm-up source plays "
                                 "per step (every call of a trainable agent is a target).")
    curriculum: list[Stage] = Field(
        default_factory=list, description="Stages of task / scenario overrides, each with a "
        "promotion rule; empty: the scenario as written.")
    demo_episodes: int = Field(0, ge=0, description="Extra instances per iteration played by "
                               "the task oracle alone, as demonstrations for the SFT term.")
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

    #: Removed keys and what to do instead, for the unknown-key error.
    removed: ClassVar[dict[str, str]] = {k: why for k, (_, why) in REMOVED.items()}

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        """A removed key holding its old default (the resolved config.yaml of an earlier
        run) is dropped; any other value stays, to fail as a removed key."""
        if not isinstance(data, dict):
            return data
        return {k: v for k, v in data.items() if k not in REMOVED or v != REMOVED[k][0]}

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
        group_only = sorted(changed & {"baseline", "credit", "regularize_solved",
                                       "advantage_scale"})
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
        if self.influence_coef and self.episodes_per_iter < 2:
            raise ValueError(f"influence_coef={self.influence_coef} compares each call with "
                             "the same call in another task instance of the batch, and "
                             "episodes_per_iter=1 plays one; set episodes_per_iter >= 2 or "
                             "drop influence_coef.")
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
