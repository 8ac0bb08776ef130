"""Checkpoints of a :class:`~marl.training.trainer.Trainer`: save, restore, and resume.

A checkpoint is a directory written atomically (every file fsynced before the rename):
one folder of weights per trainable policy (what ``marl run --checkpoint`` loads) and
``state.pt``: optimizers, counters, the KL reference and the settings changed since the
start, saved as tensors and plain containers and loaded with ``weights_only=True``, so a
planted file runs no code. Resume tries the kept checkpoints newest first; a damaged one
is reported and gives way to the one before it.
"""

from __future__ import annotations

import pickle
import shutil
import sys
from pathlib import Path

import torch

from marl import seeds
from marl.algorithms import warmup
from marl.algorithms.common import begin_rl, reference_weights
from marl.errors import MarlError
from marl.io import atomic_dir, atomic_write_jsonl, read_jsonl, recover
from marl.runner import build_policies

#: Rows a trainer keeps in memory (``Trainer.rows``); ``metrics.jsonl`` holds every row.
RECENT = 1000


class Checkpoints:
    """The checkpoint half of :class:`~marl.training.trainer.Trainer` (a mixin: it works
    on the trainer's own state)."""

    def save(self, path: Path) -> Path:
        """Write a checkpoint to the directory ``path`` (atomically): every trainable
        policy's weights (loadable by ``marl run --checkpoint``), the optimizers, the
        counters, the KL reference (and when it was set), the learning rate's schedule and
        the settings changed by :meth:`set`."""
        def write(tmp: Path) -> None:
            for t in self.learner.trainables:
                t.policy.save(tmp / t.name)
            torch.save({"iteration": self.iteration, "warmed": self.warmed,
                        "warmup_steps": self.warmup_steps, "learnt_steps": self.learnt_steps,
                        "habits": self.habits.table,
                        "stage": self.stage, "stage_start": self.stage_start,
                        "learner": self.learner.state_dict(), "best": self.best,
                        "wall": self._now(), "settings": self.changed,
                        "reference": reference_weights(self.learner.trainables),
                        "reference_at": self.reference_at,
                        "settled": self.settled,
                        "plateau": self.plateau.state_dict()}, tmp / "state.pt")

        try:
            final = atomic_dir(path, write)
        except OSError:
            raise
        except Exception as exc:  # torch and safetensors report a failed write their own way
            raise MarlError(f"writing the checkpoint {path} failed ({type(exc).__name__}: "
                            f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}); "
                            "the disk may be full, or a file size limit reached. The "
                            "checkpoints before it are whole: free some space, then continue "
                            "with --resume.") from None
        self._last_checkpoint, self._saved_step = self._now(), self.step_count
        return final

    def restore(self, path: Path) -> None:
        """Continue from the checkpoint in ``path`` (written by :meth:`save`): weights,
        optimizers, counters, curriculum stage and changed settings. The logs are left as
        they are (``resume`` truncates them to the checkpoint)."""
        path = Path(path)
        missing = [t.name for t in self.learner.trainables if not (path / t.name).is_dir()]
        if missing or not (path / "state.pt").is_file():
            raise MarlError(f"{path} is not a complete checkpoint (missing "
                            f"{missing or 'state.pt'}); a checkpoint holds one folder per "
                            "trainable policy and state.pt.")
        try:  # tensors and plain data only: a planted pickle runs nothing, it is refused
            state = torch.load(path / "state.pt", weights_only=True)
        except pickle.UnpicklingError as exc:
            raise MarlError(f"{path / 'state.pt'} holds more than tensors and plain data, so "
                            "it is not read (written by another program, or tampered "
                            f"with): {str(exc).splitlines()[0]}") from None
        except Exception as exc:  # truncated or damaged: torch raises several kinds
            raise MarlError(f"{path / 'state.pt'} cannot be read ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else 'damaged'})") from None
        try:
            self._load_weights(path)
        except MarlError:
            raise
        except Exception as exc:  # a truncated or damaged weights file
            raise MarlError(f"the weights in {path} cannot be read ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else 'damaged'})") from None
        self.learner.load_state_dict(state["learner"])
        self.iteration, self.warmed, self.best, self.wall = (
            state["iteration"], state["warmed"], state["best"], state["wall"])
        self.stage, self.stage_start = state["stage"], state["stage_start"]
        # where the warm-up ended (sooner once learnt), and its count towards that
        self.warmup_steps = min(self.warmup_steps, state.get("warmup_steps", self.warmup_steps))
        self.learnt_steps = state.get("learnt_steps", 0)
        self.reference_at = state.get("reference_at", 0)
        self.settled = state.get("settled", False)  # its eps came back with the optimizers
        if "plateau" in state:  # its lr came back with the optimizers
            self.plateau.load_state_dict(state["plateau"])
        self.habits = warmup.Habits(self.cfg.seed, state["habits"],
                             ciphers=self.cfg.warmup_prior == "ciphers")
        self.changed = {}
        self.set(**state.get("settings", {}))  # also points the learner at the stage's team
        if self.phase == "rl":
            reference = state.get("reference")
            if not reference:  # written before checkpoints carried their reference
                warm = self.out / "checkpoints" / "warmup"
                reference = self._weights(warm if warm.is_dir() else None)
            begin_rl(self.learner.trainables, self.cfg, reference=reference,
                     reset_optimizer=False)
        self._last_checkpoint, self._saved_step = self.wall, self.step_count

    def _checkpoint(self, is_best: bool = False) -> None:
        prefix = "warmup_" if self.phase == "warmup" else "iter_"
        count = self.warmed if self.phase == "warmup" else self.iteration
        self.save(self.out / "checkpoints" / f"{prefix}{count:06d}")
        if is_best:
            self.save(self.out / "checkpoints" / "best")
        kept = sorted((self.out / "checkpoints").glob(f"{prefix}*"))
        for stale in kept[: -self.cfg.keep_checkpoints]:
            shutil.rmtree(stale)

    def _finish_warmup(self) -> None:
        """The warm-up's last step: keep its model as ``checkpoints/warmup`` (the format-only
        team, and the reference of the KL term), drop the intermediate ones, start RL."""
        begin_rl(self.learner.trainables, self.cfg)
        self.habits = warmup.Habits(self.cfg.seed)  # learnt; RL never needs them again
        self.save(self.out / "checkpoints" / "warmup")
        for stale in (self.out / "checkpoints").glob("warmup_*"):
            shutil.rmtree(stale)

    def _kept(self) -> list[Path]:
        """The kept checkpoints, furthest into the run first: iterations, the end of the
        warm-up, warm-up steps."""
        root = self.out / "checkpoints"
        return [p for pattern in ("iter_*", "warmup", "warmup_*")
                for p in sorted(root.glob(pattern), reverse=True)]

    def _resume(self) -> None:
        for note in [*recover(self.out), *recover(self.out / "checkpoints")]:
            self.log(f"--resume: {note}")
        kept = self._kept()
        if not kept:
            self.log(f"resuming {self.out}: no checkpoint yet, starting from the beginning")
            self._truncate_logs()
            return
        failures = []
        for path in kept:  # a damaged checkpoint gives way to the one before it
            try:
                self.restore(path)
                break
            except MarlError as exc:
                failures.append(str(exc))
                self.log(f"--resume: {exc}; trying the checkpoint before it")
        else:
            raise MarlError(f"--resume: none of the {len(kept)} kept checkpoints of {self.out} "
                            "can be read:\n  " + "\n  ".join(failures) + "\nDelete "
                            f"{self.out / 'checkpoints'} (and metrics.jsonl) to start over.")
        self._truncate_logs()
        self.log(f"resuming {self.out} after {self._where()}")

    def _weights(self, checkpoint: Path | None) -> dict[str, list[torch.Tensor]]:
        """Parameters of each trainable policy saved in ``checkpoint`` (None: the initial
        weights of this run's seed)."""
        seed = 0 if checkpoint is not None else seeds.derive_seed(self.cfg.seed, seeds.INIT)
        saved = build_policies(self.teams[0], seed=seed, checkpoint=checkpoint)
        return {t.name: [p.detach() for p in saved[t.agents[0]].parameters()]
                for t in self.learner.trainables}

    def _load_weights(self, checkpoint: Path) -> None:
        weights = self._weights(checkpoint)
        for t in self.learner.trainables:
            with torch.no_grad():
                for p, q in zip(t.policy.parameters(), weights[t.name], strict=True):
                    p.copy_(q)

    def _truncate_logs(self) -> None:
        rows = [r for r in read_jsonl(self.out / "metrics.jsonl", self.log, repair=True)
                if isinstance(r, dict) and r.get("step", sys.maxsize) <= self.step_count]
        atomic_write_jsonl(self.out / "metrics.jsonl", rows)
        self.rows = rows[-RECENT:]
        for f in (self.out / "episodes").glob("*.jsonl"):
            kind, number = f.stem.rsplit("_", 1)
            if int(number) > (self.warmed if kind.endswith("warmup") else self.iteration):
                f.unlink()

    def _where(self) -> str:
        if self.phase == "warmup":
            return f"warm-up step {self.warmed} of {self.warmup_steps}"
        return f"iteration {self.iteration}"
