"""``marl train`` on ``signal`` with rollouts from vLLM vs from our engine, same model.

Both policies (speaker, listener) start from one small Llama checkpoint built here
(hidden 128, 4 heads: a head size vLLM's CPU kernels accept). The same training config
and seed run twice, once with ``backend: hf`` (our engine generates) and once with
``backend: vllm`` (vLLM generates; the training model scores and learns, and pushes its
weights into vLLM after every update). Prints, for each, the greedy eval success at every
evaluation with the seconds it took to get there, and iterations per second.

    python benchmarks/vllm_train.py [--iterations 300] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import yaml

from marl.algorithms.config import TrainConfig
from marl.policies.hf_local import build_tiny_hf
from marl.team import load_team
from marl.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def scenario(model: Path, backend: str, out: Path) -> Path:
    data = yaml.safe_load((ROOT / "scenarios" / "signal.yaml").read_text())
    data["policies"] = {name: {**spec, "backend": backend, "path": str(model)}
                        for name, spec in data["policies"].items()}
    path = out / f"signal_{backend}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def train(path: Path, out: Path, iterations: int) -> tuple[list[tuple[int, float, float]], float]:
    # The Llama is built here with random weights, not pretrained: it needs the warm-up.
    cfg = TrainConfig(iterations=iterations, eval_every=20, checkpoint_every=10**6,
                      keep_checkpoints=1, warmup_pretrained=True)
    Trainer(load_team(path), cfg, out, log=lambda msg: None).train()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    evals = [(r["iteration"], r["wall_s"], r["eval_success_rate"]) for r in rl
             if "eval_success_rate" in r]
    warmup_s = max((r["wall_s"] for r in rows if r["phase"] == "warmup"), default=0.0)
    return evals, len(rl) / (rl[-1]["wall_s"] - warmup_s)  # wall_s: training seconds so far


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        model = build_tiny_hf(out / "llama", hidden_size=128, num_heads=4)
        results = {b: train(scenario(model, b, out), out / b, args.iterations)
                   for b in ("hf", "vllm")}
    print(f"signal, both policies from one tiny Llama (128 wide, 2 layers), default training "
          f"config, {args.iterations} iterations, {args.threads} thread(s)")
    for backend, (evals, ips) in results.items():
        curve = ", ".join(f"it {i} ({s:.0f} s): {e:.2f}" for i, s, e in evals)
        print(f"{backend:>5}: {ips:.2f} iterations/s (RL phase); greedy eval: {curve}")
    print(f"vllm / hf iterations per second: {results['vllm'][1] / results['hf'][1]:.2f}x")


if __name__ == "__main__":
    main()
