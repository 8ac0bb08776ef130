"""Several LoRA adapters on one base, on a CPU: one forward over a batch that mixes the
adapters (peft's ``adapter_names``, one adapter per row) against one forward per adapter.
(Whole rollouts, which prefill apart and decode mixed: ``adapter_rollout.py``.)

    python benchmarks/adapter_batches.py [--adapters 4] [--rows 8] [--length 64]

One process, a locally built Llama (~113M parameters, as in ``shared_base.py``) with
``--adapters`` LoRA adapters (r 8). Each way runs the same prefill forwards
(``--rows`` prompts per adapter of ``--length`` tokens), ``--reps`` times after a warm-up;
the last line is the ratio of their median times.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rows", type=int, default=8, help="prompts per adapter")
    parser.add_argument("--length", type=int, default=64, help="tokens per prompt")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import peft
    import transformers

    from marl.policies.hf_local import build_tiny_hf

    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_hf(Path(tmp) / "base", hidden_size=768, num_layers=12,
                             num_heads=12, intermediate_size=3072)
        model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                             task_type="CAUSAL_LM")
    names = [f"a{i}" for i in range(args.adapters)]
    model = peft.get_peft_model(model, config, adapter_name=names[0]).eval()
    for name in names[1:]:
        model.add_adapter(name, config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # LoRA's B starts at zero: give every adapter weights of its own
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.01 * torch.randn(p.shape, generator=generator))
    ids = torch.randint(4, 100, (args.adapters * args.rows, args.length), generator=generator)
    rows = [name for name in names for _ in range(args.rows)]

    def mixed() -> torch.Tensor:
        return model(input_ids=ids, adapter_names=rows).logits[:, -1]

    def apart() -> torch.Tensor:
        out = []
        for i, name in enumerate(names):
            model.set_adapter(name)
            out.append(model(input_ids=ids[i * args.rows:(i + 1) * args.rows]).logits[:, -1])
        return torch.cat(out)

    with torch.no_grad():
        assert torch.allclose(mixed(), apart(), atol=1e-4)  # the same logits either way
        times = {}
        for label, fn in (("mixed batch", mixed), ("one batch per adapter", apart)):
            fn()
            runs = []
            for _ in range(args.reps):
                start = time.perf_counter()
                fn()
                runs.append(time.perf_counter() - start)
            times[label] = statistics.median(runs)
    print(f"{args.adapters} adapters x {args.rows} prompts of {args.length} tokens, "
          f"{torch.get_num_threads()} thread(s), median of {args.reps}:")
    for label, seconds in times.items():
        print(f"  {label:>22}: {seconds:.3f} s")
    print(f"one batch per adapter / mixed batch: "
          f"{times['one batch per adapter'] / times['mixed batch']:.2f}x the time")


if __name__ == "__main__":
    main()
