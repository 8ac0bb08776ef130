"""The training loop around the algorithms of :mod:`marl.algorithms`: the
:class:`~marl.training.trainer.Trainer` (warm-up, RL iterations, evaluation), its
checkpoints and resume (:mod:`marl.training.checkpoints`, :mod:`marl.training.resume`),
its metrics rows (:mod:`marl.training.rows`), curricula (:mod:`marl.training.curriculum`)
and the optional wandb run."""
