"""How fast an answer agent can learn its part at all: a ceiling for the generality suite.

    python benchmarks/answer_ceiling.py VARIANT [--steps 1500] [--batch 16] [--lr 1e-3]
                                        [--every 250] [--episodes 512] [--out FILE]

Every other agent of the variant (a name in ``benchmarks/generality/`` or a scenario path)
plays the task's scripted oracle, the plainest code there is, and is never trained; the
answer agents' policy, freshly initialised as ``marl train`` builds it, is trained
supervised on each instance's right answer (one Adam step on ``--batch`` new instances
per step, the cross-entropy of the answer as a message). Every ``--every`` steps the
answer agents answer ``--episodes`` eval instances greedily beside the oracle team.

This is a diagnosis, not training from reward: the teammates are the oracle and the
answerer is given the right answer, which a run never has (``answer_feedback: full``
tells the scores of the answers it could have given after each episode; the defaults
also teach a team its code). Where an answerer given all of that stays below 0.8 of its
variant's gap after as many steps as a 600 s run takes RL iterations, no recipe gets the
variant there in the budget: the model must learn the answer's function faster first.
Prints one line per evaluation and writes them to ``--out`` as JSON (optional).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # generality.py sits beside this
from generality import VARIANTS, references, success  # noqa: E402


def variant_path(name: str) -> Path:
    """A variant's name in ``benchmarks/generality/`` or a scenario file's path."""
    path = VARIANTS / f"{name}.yaml" if not name.endswith((".yaml", ".yml")) else Path(name)
    if not path.is_file():
        names = sorted(p.stem for p in VARIANTS.glob("*.yaml"))
        raise SystemExit(f"{name}: no such variant or scenario file; variants: {names}")
    return path


def answer_rows(team, batch, tokenizer) -> tuple[list[tuple[int, ...]], list[str]]:
    """The prompt of every answer agent's final call in ``batch`` and the right answer."""
    prompts, answers = [], []
    for k in batch.slots(team.answer_agents).tolist():
        agent = batch.agents[int(batch.call_agent[k])]
        if not team.is_final_call(agent, int(batch.call_round[k])):
            continue
        for b, instance in enumerate(batch.instances):
            prompts.append(tuple(tokenizer.encode_prompt(batch.observations[b][k])))
            answers.append(instance.answer)
    return prompts, answers


def ceiling(path: Path, steps: int, batch_size: int, lr: float, every: int, episodes: int,
            seed: int = 0, log=print) -> list[dict]:
    """Train ``path``'s answer agents as the module says; one row per evaluation."""
    from marl.algorithms.common import Trainable, adam, guarded_step, sft_term, target_ids
    from marl.algorithms.config import TrainConfig
    from marl.policies.lm import LMPolicy
    from marl.policies.scripted import ScriptedPolicy
    from marl.rollout import collect
    from marl.runner import build_policies
    from marl.seeds import TRAIN, derive_seed
    from marl.team import load_team

    team = load_team(path)
    built = build_policies(team, seed=seed)
    learner = built[team.answer_agents[0]]
    if not isinstance(learner, LMPolicy) or any(built[a] is not learner
                                                for a in team.answer_agents):
        raise SystemExit(f"{path.name}: the answer agents must share one model policy.")
    cfg = TrainConfig(lr=lr, seed=seed)
    t = Trainable("answer", learner, list(team.answer_agents), adam(learner.parameters(), cfg))
    oracle = ScriptedPolicy(team.task, tokenizer=learner.tokenizer)
    playing = {a: learner if a in team.answer_agents else oracle for a in team.ids}
    teaching = dict.fromkeys(team.ids, oracle)
    rows, start = [], time.perf_counter()
    for step in range(steps + 1):
        if step % every == 0 or step == steps:
            rows.append({"step": step, "seconds": round(time.perf_counter() - start, 1),
                         "success": success(team, playing, episodes, seed)})
            log(f"step {step}: success {rows[-1]['success']:.3f} "
                f"({rows[-1]['seconds']:.0f} s)")
        if step == steps:
            break
        batch = collect(team, teaching, batch_size, seed=derive_seed(seed, TRAIN, step))
        prompts, answers = answer_rows(team, batch, learner.tokenizer)
        guarded_step(t, sft_term(t, prompts, [target_ids(t, a) for a in answers]), cfg)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", help="a name in benchmarks/generality/ or a scenario path")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=16, help="new instances per step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--every", type=int, default=250, help="steps between evaluations")
    parser.add_argument("--episodes", type=int, default=512, help="eval instances")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the rows here (JSON)")
    args = parser.parse_args()
    if min(args.steps, args.batch, args.every, args.episodes) < 1:
        raise SystemExit("--steps, --batch, --every and --episodes must be at least 1")
    path = variant_path(args.variant)
    scripted, floor = references(path, args.episodes)
    print(f"{path.stem}: scripted {scripted:.2f}, floor {floor:.2f}; the other agents play "
          "the oracle and the answerer is trained on the right answers", flush=True)
    rows = ceiling(path, args.steps, args.batch, args.lr, args.every, args.episodes,
                   args.seed, log=lambda line: print(line, flush=True))
    out = summary(rows, scripted, floor)
    print(f"best {out['best']:.3f}; normalised {fmt(out['normalised'])}; 0.8 of the gap "
          f"first at step {fmt(out['to_0.8_step'])}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"variant": path.stem, "scripted": scripted,
                                        "floor": floor, "steps": args.steps,
                                        "batch": args.batch, "lr": args.lr, **out,
                                        "rows": rows}, indent=2) + "\n")


def summary(rows: list[dict], scripted: float, floor: float) -> dict:
    """The best evaluation, its normalised score (best - floor) / (scripted - floor), and
    the first step evaluated at 0.8 of that gap or more (None: none, or no gap)."""
    gap = scripted - floor
    best = max(r["success"] for r in rows)
    reach = next((r["step"] for r in rows if r["success"] >= floor + 0.8 * gap), None)
    return {"best": best, "normalised": (best - floor) / gap if gap > 0 else None,
            "to_0.8_step": reach if gap > 0 else None}


def fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}" if isinstance(x, float) else str(x)


if __name__ == "__main__":
    main()
