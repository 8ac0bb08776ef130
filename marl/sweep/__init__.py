"""``marl sweep``: a grid of scenario variants, evaluated or trained, one table row per
cell. :mod:`marl.sweep.grid` expands and applies the grid, :mod:`marl.sweep.run` runs the
cells and keeps the resume log, :mod:`marl.sweep.tables` writes the table and the plot."""

from marl.sweep.run import Executor, Job, SweepReport, run_sweep

__all__ = ["Executor", "Job", "SweepReport", "run_sweep"]
