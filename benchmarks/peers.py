"""Completions per second of TRL's ``GRPOTrainer`` and CoMLRL's ``MAGRPOTrainer`` on a
given tiny checkpoint and prompts: the peer half of ``benchmarks/peers_compare.py``.

Runs under the peer environment, never the project's (it imports neither ``marl`` nor
anything the project depends on beyond what the peers install)::

    python3.11 -m venv /tmp/peers
    /tmp/peers/bin/pip install torch==2.13.0     # the CPU build; a bare torch may pull CUDA
    /tmp/peers/bin/pip install trl comlrl
    /tmp/peers/bin/python benchmarks/peers.py trl --model DIR --prompts prompts.json
    /tmp/peers/bin/python benchmarks/peers.py comlrl --model DIR --prompts prompts.json

``DIR`` is a ``save_pretrained`` directory (model and tokenizer); ``prompts.json`` is
``{"G": 8, "max_new_tokens": 8, "instances": [{"speaker": obs, "listener": obs,
"target": "2"}, ...]}``: the observations each agent of a ``signal`` instance reads (the
tokenizer's BOS token is prepended, as ``marl`` does) and the instance's target object.
``peers_compare.py`` writes both.

One step = one generated batch of every instance and one optimizer step per model:
- ``trl``: one model; each instance gives two prompts (speaker's and listener's
  observation), each sampled G times, so a step is 2 x instances x G completions.
- ``comlrl``: two agents (speaker, listener), each its own model and optimizer; each
  agent samples G completions of its own prompt per instance (aligned joint mode,
  one turn), so a step is also 2 x instances x G completions.
Reward: 1.0 when a completion's first character is the instance's target (TRL: every
completion; CoMLRL: the joint reward of the listener's answer, the Lewis game's success).
Settings match ``marl``'s side: float32, temperature 1, no top-p / top-k, lr 1e-3, no
reference model or KL, no gradient checkpointing, no logging, saving or evaluation.
After one untimed warm-up step, ``--steps`` steps are timed; the script prints one JSON
line ``{"peer", "completions_per_s", "steps", "settings"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

LR = 1e-3


def first_char_reward(completions: list[str], target: list[str], **_) -> list[float]:
    """TRL reward: 1.0 where a completion starts with its instance's target.

    >>> first_char_reward(["2ab", "x2", ""], ["2", "2", "2"])
    [1.0, 0.0, 0.0]
    """
    return [1.0 if c[:1] == t else 0.0 for c, t in zip(completions, target, strict=True)]


def lewis_reward(speaker: list[str], listener: list[str], *, batch_items: list[dict]
                 ) -> list[float]:
    """CoMLRL joint reward of one aligned pair: 1.0 when the listener's answer starts
    with the target.

    >>> lewis_reward(["?"], ["3!"], batch_items=[{"target": "3"}])
    [1.0]
    """
    return [1.0 if listener[0][:1] == batch_items[0]["target"] else 0.0]


def load(model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(model_dir)


def run_trl(model_dir: Path, spec: dict, steps: int) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model, tok = load(model_dir)
    g, instances = spec["G"], spec["instances"]
    rows = [{"prompt": tok.bos_token + i[a], "target": i["target"]}
            for i in instances for a in ("speaker", "listener")]
    per_step = len(rows) * g
    ends: list[float] = []
    lengths: list[int] = []

    def reward(completions: list[str], target: list[str], completion_ids: list, **_):
        lengths.extend(len(c) for c in completion_ids)
        return first_char_reward(completions, target)

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-"), use_cpu=True, bf16=False,
        gradient_checkpointing=False, report_to="none", save_strategy="no",
        logging_strategy="no", disable_tqdm=True, learning_rate=LR,
        lr_scheduler_type="constant", warmup_steps=0, max_steps=1 + steps, seed=0,
        # one optimizer step per generated batch: the whole batch in one micro-batch
        per_device_train_batch_size=per_step, gradient_accumulation_steps=1,
        steps_per_generation=1, num_iterations=1, num_generations=g,
        max_completion_length=spec["max_new_tokens"], temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, scale_rewards="none", dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=tok,
                          callbacks=[Clock()])
    trainer.train()
    settings = {"completions_per_step": per_step, "models": 1, "prompts_per_step": len(rows),
                "G": g, "max_new_tokens": spec["max_new_tokens"],
                "per_device_train_batch_size": per_step, "gradient_accumulation_steps": 1,
                "steps_per_generation": 1, "num_iterations": 1, "beta": 0.0,
                "ref_model": trainer.ref_model is not None, "loss_type": args.loss_type,
                "bf16": False, "gradient_checkpointing": False, "use_vllm": False,
                "mean_prompt_tokens": mean_tokens(tok, [r["prompt"] for r in rows]),
                "mean_completion_tokens": sum(lengths) / len(lengths)}
    return result("trl", per_step, steps, ends, settings)


def run_comlrl(model_dir: Path, spec: dict, steps: int) -> dict:
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    from datasets import Dataset

    _, tok = load(model_dir)
    g, instances = spec["G"], spec["instances"]
    agents = ("speaker", "listener")
    per_step = len(instances) * len(agents) * g
    ends: list[float] = []
    generated: list[int] = []

    class Timed(MAGRPOTrainer):
        """Stamps the end of each update (both agents' buffers drained together) and
        counts generated tokens."""

        def _drain_ready_buffers(self, ready_agents: list[int]) -> None:
            super()._drain_ready_buffers(ready_agents)
            if ready_agents:
                ends.append(time.perf_counter())

        def _generate_completions(self, *a, **kw):
            out = super()._generate_completions(*a, **kw)
            generated.extend(out["response_lens"])
            return out

    args = MAGRPOConfig(
        num_train_epochs=1, agent_learning_rate=LR, num_agents=len(agents),
        agent_devices="cpu", num_generations=g, max_new_tokens=spec["max_new_tokens"],
        temperature=1.0, top_p=1.0, top_k=0, num_turns=1, joint_mode="aligned",
        eval_interval=0, eval_num_samples=0,
        # one optimizer step per agent after all instances of a batch are generated
        rollout_buffer_size=len(instances), train_batch_size=len(instances),
        advantage_mode="mean", advantage_normalization=False, reference_kl_enabled=False,
    )
    items = [dict(i) for _ in range(1 + steps) for i in instances]  # in order, unshuffled
    trainer = Timed(
        agent_model=str(model_dir), num_agents=len(agents), tokenizer=tok,
        model_config={"dtype": torch.float32},
        train_dataset=Dataset.from_list(items), reward_func=lewis_reward,
        formatters=[lambda item, a=a: tok.bos_token + item[a] for a in agents],
        args=args,
    )
    trainer.verbose = False
    trainer.train()
    prompts = [tok.bos_token + i[a] for i in instances for a in agents]
    settings = {"completions_per_step": per_step, "models": len(agents),
                "instances_per_step": len(instances), "G": g,
                "max_new_tokens": spec["max_new_tokens"],
                "rollout_buffer_size": len(instances), "train_batch_size": len(instances),
                "joint_mode": "aligned", "num_turns": 1, "advantage_mode": "mean",
                "advantage_normalization": False, "reference_kl_enabled": False,
                "generate": "HF generate per agent per instance (num_return_sequences=G)",
                "loss": "one forward per completion",
                "mean_prompt_tokens": mean_tokens(tok, prompts),
                "mean_completion_tokens": sum(generated) / len(generated)}
    return result("comlrl", per_step, steps, ends, settings)


def mean_tokens(tok, texts: list[str]) -> float:
    return sum(len(tok(t)["input_ids"]) for t in texts) / len(texts)


def result(peer: str, per_step: int, steps: int, ends: list[float], settings: dict) -> dict:
    if len(ends) != 1 + steps:
        raise RuntimeError(f"{peer}: expected {1 + steps} optimizer steps (1 warm-up + "
                           f"{steps}), saw {len(ends)}; the batch settings do not give one "
                           "optimizer step per generated batch.")
    seconds = ends[-1] - ends[0]
    return {"peer": peer, "completions_per_s": steps * per_step / seconds, "steps": steps,
            "settings": settings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=["trl", "comlrl"])
    parser.add_argument("--model", type=Path, required=True, help="save_pretrained directory")
    parser.add_argument("--prompts", type=Path, required=True, help="JSON written by "
                        "peers_compare.py")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args()
    # Python puts this script's folder first on sys.path, and benchmarks/kernels.py would
    # shadow the `kernels` package that transformers imports.
    sys.path.remove(str(Path(__file__).resolve().parent))
    os.environ.setdefault("WANDB_MODE", "disabled")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    spec = json.loads(args.prompts.read_text())
    run = run_trl if args.peer == "trl" else run_comlrl
    print(json.dumps(run(args.model, spec, args.steps)), flush=True)


if __name__ == "__main__":
    main()
