"""The classic MARL baseline (``marl baseline``): the scenario as a symbol game
(:mod:`marl.baseline.symbols`, a PettingZoo env of discrete symbols) trained by RLlib's
PPO (:mod:`marl.baseline.rllib`, which needs the ``rllib`` extra), with its settings in
:mod:`marl.baseline.config`."""
