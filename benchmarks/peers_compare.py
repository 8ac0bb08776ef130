"""Completions per second of ``marl train`` vs TRL's ``GRPOTrainer`` and CoMLRL's
``MAGRPOTrainer``: the libraries a user would otherwise pick.

The peers live in their own virtual environment, never in the project's dependencies.
Create it once (``torch==2.13.0`` pinned: a bare ``torch`` may pull a multi-GB CUDA build)::

    python3.11 -m venv /tmp/peers
    /tmp/peers/bin/pip install torch==2.13.0
    /tmp/peers/bin/pip install trl comlrl

then, from the project's environment::

    python benchmarks/peers_compare.py [--peer-python /tmp/peers/bin/python] [--steps 6]
                                       [--rounds 3] [--threads 2]

``--threads`` applies to every side. On a 2-core machine that other work keeps busy, use
``--threads 1``: two threads then wait on each other (5x slower here, unevenly per side).

Every side trains the same tiny Llama (``build_tiny_hf``: 2 layers x 64, char tokenizer)
on the same batch, with one on-policy optimizer step per generated batch, no reference
model (marl ``kl_coef 0``, TRL ``beta 0``, CoMLRL has none) and G = 8 completions of at
most 8 new tokens per prompt, sampled at temperature 1 with no stop string:

- marl: ``signal.yaml`` (speaker, listener: two models, two optimizers), 16 instances x
  G 8 x 2 agents = 256 completions per step;
- TRL: one model, the same 16 instances' 32 prompts (16 speaker + 16 listener
  observations) x G 8 = 256 completions per step;
- CoMLRL: two agents (two models), 16 instances x 2 agents x G 8 = 256 completions per step.

A completion is one agent call: one prompt in, at most 8 tokens out. Prompts are the
observations marl's own step reads (~89 tokens on average). Each side runs one untimed
warm-up step, then ``--steps`` timed steps; ``benchmarks/peers.py`` (run under the peer
python) prints one JSON line per peer. The sides run one after another, so a slow spell
of a shared machine lands on one of them: ``--rounds`` repeats the three, each round
prints its ratios, and the last line gives the median ratio over the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from train import hf_team  # benchmarks/train.py, beside this script

from marl.algorithms.config import TrainConfig
from marl.policies.hf_local import build_tiny_hf
from marl.rollout import collect
from marl.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
SETUP = """the peer python {python} does not exist. Create the peer environment with:

    python3.11 -m venv /tmp/peers
    /tmp/peers/bin/pip install torch==2.13.0
    /tmp/peers/bin/pip install trl comlrl

(torch pinned so that pip takes the CPU build), then pass --peer-python /tmp/peers/bin/python."""


def marl_side(model: Path, out: Path, episodes: int, group: int, new_tokens: int,
              steps: int) -> tuple[dict, list[dict]]:
    """Time ``steps`` MAGRPO iterations of ``marl``'s Trainer on ``signal.yaml`` with
    the tiny HF Llama; return the result and the instances of one batch (prompts for the
    peers)."""
    team = hf_team("signal.yaml", model, max_new_tokens=new_tokens, stop=[])
    cfg = TrainConfig(episodes_per_iter=episodes, group_size=group, epochs=1, minibatches=1,
                      warmup_source="none", kl_coef=0.0, eval_every=10**6,
                      checkpoint_every=10**6, transcripts_per_iter=0)
    trainer = Trainer(team, cfg, out / "marl", log=lambda msg: None)
    trainer.step()  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        trainer.step()
    seconds = time.perf_counter() - start
    per_step = episodes * group * len(team.ids)
    batch = collect(team, trainer.policies, episodes, group, seed=1)
    firsts = [int((batch.group_ids == g).nonzero()[0]) for g in range(episodes)]
    instances = [{**{batch.agents[int(a)]: batch.observations[b][k]
                     for k, a in enumerate(batch.call_agent)},
                  "target": batch.records[b]["target"]} for b in firsts]
    prompt_tokens = [len(p) for row in batch.prompt_ids for p in row]
    result = {"peer": "marl", "completions_per_s": steps * per_step / seconds, "steps": steps,
              "settings": {"completions_per_step": per_step, "models": len(team.ids),
                           "optimizer_steps_per_batch": 1, "instances": episodes,
                           "G": group, "max_new_tokens": new_tokens, "stop": None,
                           "kl_coef": 0.0, "fast_engine": True,
                           "mean_prompt_tokens": sum(prompt_tokens) / len(prompt_tokens),
                           "mean_completion_tokens": float(batch.mask.sum()) / per_step}}
    return result, instances


def peer_side(python: Path, peer: str, model: Path, prompts: Path, steps: int,
              threads: int) -> dict:
    cmd = [str(python), str(ROOT / "benchmarks" / "peers.py"), peer, "--model", str(model),
           "--prompts", str(prompts), "--steps", str(steps), "--threads", str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{peer} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", type=Path, default=Path("/tmp/peers/bin/python"))
    parser.add_argument("--steps", type=int, default=6, help="timed steps per side")
    parser.add_argument("--rounds", type=int, default=3, help="marl, TRL, CoMLRL this often")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, every side")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not args.peer_python.exists():
        print(SETUP.format(python=args.peer_python), file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(args.threads)
    out = args.out or Path(tempfile.mkdtemp(prefix="marl-peers-"))
    model = build_tiny_hf(out / "hf")
    print(f"tiny HF Llama (2 layers x 64, char tokenizer), G 8, <= 8 new tokens, one "
          f"on-policy step per batch, {args.steps} timed steps after one warm-up, "
          f"{args.threads} thread(s), {args.rounds} round(s)")
    ratios: dict[str, list[float]] = {"trl": [], "comlrl": []}
    for k in range(args.rounds):
        mine, instances = marl_side(model, out / f"round{k}", 16, 8, 8, args.steps)
        prompts = out / "prompts.json"
        prompts.write_text(json.dumps({"G": 8, "max_new_tokens": 8, "instances": instances}))
        results = [mine] + [peer_side(args.peer_python, p, model, prompts, args.steps,
                                      args.threads) for p in ratios]
        print(f"round {k + 1}\n{'library':>8} {'completions/s':>14} {'per step':>9} "
              f"{'models':>7} {'prompt tok':>11} {'compl tok':>10} {'marl x':>7}")
        for r in results:
            st, ratio = r["settings"], mine["completions_per_s"] / r["completions_per_s"]
            if r["peer"] in ratios:
                ratios[r["peer"]].append(ratio)
            print(f"{r['peer']:>8} {r['completions_per_s']:14.1f} "
                  f"{st['completions_per_step']:9d} {st['models']:7d} "
                  f"{st['mean_prompt_tokens']:11.1f} {st['mean_completion_tokens']:10.2f} "
                  f"{ratio:7.2f}")
        for r in results:
            print(json.dumps(r))
    print("median over rounds: " + ", ".join(
        f"marl {statistics.median(v):.2f}x {peer}" for peer, v in ratios.items()))


if __name__ == "__main__":
    main()
