"""Memory and speed of many LoRA agents on one base model: N = 1, 2, 4, 8 agents in a chain
(``relay_v0``), each its own LoRA policy on the same locally built Llama (~113M
parameters, so that weights dominate), in ``marl run`` and a few iterations of
``marl train``.

    python benchmarks/shared_base.py                        # this checkout
    python benchmarks/shared_base.py --baseline /tmp/old    # and a checkout to compare

Each measurement is a fresh process (its peak RSS is its own): it builds the team's
policies and plays (``run``: 4 episodes) or trains (``train``: 2 iterations of 4 episodes,
no warm-up, the KL term on, so references exist, and a final evaluation of 4), then
reports its peak RSS, the bytes of every distinct parameter storage it holds (policies
and KL references), and for ``train`` the samples per second of its last iteration.
``--baseline DIR`` runs the same in a checkout of another commit (e.g. one before bases
were shared: every policy loaded its own copy, and every KL reference was a deep copy)
by putting DIR first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DRIVER = r"""
import json, resource, sys, torch
torch.set_num_threads(int(sys.argv[4]))
from marl.team import load_team
mode, scenario, out = sys.argv[1], sys.argv[2], sys.argv[3]
team = load_team(scenario)
tensors = []
if mode == "run":
    from marl.rollout import collect
    from marl.runner import build_policies
    policies = build_policies(team)
    collect(team, policies, episodes=4, seed=0)
    for p in dict.fromkeys(policies.values()):
        tensors += list(p.model.model.parameters())
    rate = None
else:
    from marl.algorithms.config import TrainConfig
    import marl
    from pathlib import Path
    # a checkout from before marl/training/ keeps the trainer at marl/trainer.py
    if (Path(marl.__file__).parent / "training").is_dir():
        from marl.training.trainer import Trainer
    else:
        from marl.trainer import Trainer
    cfg = TrainConfig(warmup_source="none", iterations=2, episodes_per_iter=2, group_size=2,
                      eval_every=100, eval_episodes=4, checkpoint_every=100,
                      transcripts_per_iter=0)
    trainer = Trainer(team, cfg, out, log=lambda m: None)
    trainer.train()
    for t in trainer.learner.trainables:
        tensors += list(t.policy.model.model.parameters())
        if t.reference is not None:
            tensors += list(t.reference.model.parameters())
    rate = trainer.rows[-1]["samples_per_s"]
seen, size = set(), 0
for x in tensors:
    key = x.untyped_storage().data_ptr()
    if key not in seen:
        seen.add(key)
        size += x.untyped_storage().nbytes()
print(json.dumps({"rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "param_bytes": size, "samples_per_s": rate}))
"""


def scenario(base: Path, n: int, out: Path) -> Path:
    """A chain of ``n`` agents carrying a fact, each its own LoRA policy on ``base``: every
    agent makes one call of about the same length whatever ``n``, so the work per policy
    stays the same and what grows with ``n`` is the agents' weights."""
    ids = [f"a{i}" for i in range(n)]
    data = {"name": f"lora{n}", "task": {"name": "relay_v0",
                                          "params": {"fact_length": 2, "source": ids[0]}},
            "agents": [{"id": a, "policy": a} for a in ids],
            "policies": {a: {"backend": "hf", "path": str(base), "max_new_tokens": 4,
                             "lora": {"r": 8}} for a in ids},
            "topology": {"kind": "chain"}, "protocol": {"rounds": 1, "answer": ids[-1]}}
    path = out / f"lora{n}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def measure(code: Path, mode: str, path: Path, out: Path, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", DRIVER, mode, str(path), str(out),
                           str(threads)], env=env, capture_output=True, text=True, cwd=out)
    if done.returncode != 0:
        raise SystemExit(f"{code} {mode} {path.name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout of another commit, measured the same way")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from marl.policies.hf_local import build_tiny_hf

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = build_tiny_hf(work / "base", hidden_size=768, num_layers=12, num_heads=12,
                             intermediate_size=3072)
        layouts = [("this checkout", ROOT)] + (
            [(f"baseline {args.baseline}", args.baseline)] if args.baseline else [])
        print("agents on one ~113M-parameter Llama, each its own LoRA (r 8) policy; peak RSS "
              "and distinct parameter bytes per process")
        print(f"{'layout':>28} {'mode':>5} {'N':>2} {'peak RSS GB':>12} "
              f"{'params GB':>10} {'samples/s':>10}")
        for i, (label, code) in enumerate(layouts):
            for mode in ("run", "train"):
                for n in args.agents:
                    out = work / f"out-{i}-{mode}-{n}"
                    out.mkdir()
                    m = measure(code, mode, scenario(base, n, work), out, args.threads)
                    rate = f"{m['samples_per_s']:10.1f}" if m["samples_per_s"] else f"{'':>10}"
                    print(f"{label:>28} {mode:>5} {n:2d} {m['rss'] / 2**30:12.2f} "
                          f"{m['param_bytes'] / 2**30:10.2f} {rate}", flush=True)


if __name__ == "__main__":
    main()
