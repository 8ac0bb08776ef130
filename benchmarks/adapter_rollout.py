"""Rollouts of LoRA adapters on one base: the adapters that act in the same layer generating
together (the default, :mod:`marl.policies.mixed`: ``hf`` decodes them in one mixed
batch, ``vllm`` serves them in one multi-LoRA call) against one batch per adapter
(``collect(..., mix_adapters=False)``).

    python benchmarks/adapter_rollout.py [--adapters 4] [--episodes 4] [--group 2]
                                         [--backend hf|vllm] [--device cuda]

The GPU check of vLLM's multi-LoRA: ``--backend vllm --device cuda`` on a GPU machine
(with ``llm-marl[vllm-gpu]``); on a CPU, ``--backend vllm`` runs vLLM's CPU build.

One process, a locally built Llama (~113M parameters, as in ``shared_base.py``); a debate
of ``--adapters`` agents (every agent acts in every round, 2 rounds), each its own LoRA
policy (r 8, weights drawn so they differ) generating up to 8 tokens. Both ways play the
same seeded batches, ``--reps`` times after a warm-up; the last line is the ratio of
their median times. It also prints whether the samples are the same either way, and
whether, after one adapter is updated, greedy rollouts still equal the training model's
(for ``vllm``: the new adapter version reached the engine).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--group", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="a 64-wide model (a smoke run)")
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--device", default="cpu", help="the policies' device (cuda: a GPU)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from marl.policies.hf_local import build_tiny_hf
    from marl.rollout import collect
    from marl.runner import build_policies
    from marl.team import load_team

    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        size = ({"hidden_size": 64, "num_heads": 2} if args.small else
                {"hidden_size": 768, "num_layers": 12, "num_heads": 12,
                 "intermediate_size": 3072})
        path = build_tiny_hf(Path(tmp) / "base", **size)
        agents = [f"a{i}" for i in range(args.adapters)]
        data = yaml.safe_load((root / "scenarios" / "gather_star.yaml").read_text())
        data["agents"] = [{"id": a, "role": "worker", "policy": a} for a in agents]
        data["topology"] = {"kind": "debate"}
        data["protocol"] = {"rounds": 2, "answer": agents[0]}
        data["policies"] = {a: {"backend": args.backend, "path": str(path), "max_new_tokens": 8,
                                "lora": {"r": 8}, "device": args.device} for a in agents}
        team = load_team(data)
        policies = build_policies(team)
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():  # LoRA's B starts at zero: give every adapter weights of its own
            for n, p in policies[agents[0]].model.shared.model.named_parameters():
                if "lora_B" in n:
                    p.copy_(0.01 * torch.randn(p.shape, generator=generator))

        def play(mix: bool):
            return collect(team, policies, args.episodes, args.group, seed=1, mix_adapters=mix)

        same = torch.equal(play(True).tokens, play(False).tokens)  # the same samples?
        print("the same samples either way:", same)
        sync_ok = _check_sync(team, policies, agents, generator, collect)
        print("after an update of one adapter, greedy rollouts equal the training model's:",
              sync_ok)
        times = {}
        for label, mix in (("adapters together", True), ("one batch per adapter", False)):
            runs = []
            for _ in range(args.reps):
                start = time.perf_counter()
                play(mix)
                runs.append(time.perf_counter() - start)
            times[label] = statistics.median(runs)
    print(f"{args.backend} on {args.device}: "
          f"{args.adapters} adapters, {args.episodes * args.group} episodes of 2 rounds, "
          f"{torch.get_num_threads()} thread(s), median of {args.reps}:")
    for label, seconds in times.items():
        print(f"  {label:>22}: {seconds:.3f} s")
    print(f"one batch per adapter / adapters together: "
          f"{times['one batch per adapter'] / times['adapters together']:.2f}x the time")


def _check_sync(team, policies, agents, generator, collect) -> bool:
    """Update one adapter in place; the engine must then generate what the training model
    does (for ``vllm``: the adapter's new version was pushed)."""
    from marl.policies.lm import LMPolicy

    collect(team, policies, 2, 1, seed=2, greedy=True)  # every adapter pushed once
    with torch.no_grad():
        for p in policies[agents[-1]].parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator).to(p.device))
    twins = {a: LMPolicy(policies[a].model, policies[a].tokenizer, policies[a].sampling,
                         module=policies[a].module) for a in agents}
    theirs = collect(team, policies, 2, 2, seed=2, greedy=True)
    ours = collect(team, twins, 2, 2, seed=2, greedy=True, mix_adapters=False)
    return torch.equal(theirs.tokens, ours.tokens)


if __name__ == "__main__":
    main()
