"""Populations in processes of their own (a process joins one Ray cluster, and the test
session's local Ray is another): a simulated two-node cluster with logical GPUs, where
members are spread over the nodes and get the resources they ask for; and a driver
interrupted with SIGINT, then resumed."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from tests.marl.conftest import ROOT

SCRIPT = """
import json, sys
from ray.cluster_utils import Cluster
from populations.config import PBTConfig
from populations.pbt import run_pbt
from marl.cluster import ray_session

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1})
cluster.add_node(num_cpus=1, num_gpus=1)
cluster.wait_for_nodes()
cfg = PBTConfig.model_validate(json.loads(sys.argv[2]))
with ray_session(cluster.address):
    run_pbt(sys.argv[1], cfg, sys.argv[3], address=cluster.address, log=lambda m: None)
cluster.shutdown()
"""


def test_members_are_spread_over_nodes_with_their_gpus(tmp_path):
    from marl.cluster import QUIET

    cfg = {"members": 2, "budget_steps": 4, "perturbation_interval": 2,
           "quantile_fraction": 0.5, "resources": {"cpus": 1, "gpus": 1},
           "mutations": {"lr": [1e-3, 3e-3]},
           "train": {"warmup_steps": 1, "warmup_episodes": 2, "episodes_per_iter": 2,
                     "group_size": 2, "eval_episodes": 2, "eval_every": 100,
                     "checkpoint_every": 1000, "transcripts_per_iter": 0}}
    out = tmp_path / "pop"
    short = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths are <= 107 bytes
    try:
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(ROOT / "scenarios" / "signal.yaml"),
             json.dumps(cfg), str(out)], env={**os.environ, **QUIET, "RAY_TMPDIR": short},
            cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in sorted(out.glob("members/*/summary.json"))]
    assert len(summaries) == 2
    assert len({s["node"] for s in summaries}) == 2  # one member per node: 1 CPU each
    assert all(len(s["gpu_ids"]) == 1 for s in summaries)
    assert all(s["device"] == "cpu" for s in summaries)  # logical GPUs: no CUDA here


def test_an_interrupted_population_says_so_and_resumes(tmp_path):
    """SIGINT to the driver: Tune's fit() returns normally with partial results; the command
    must not call that finished (exit 2, names the members, says --resume), and --resume
    completes it. Run as a process of its own, with its own local Ray."""
    import signal
    import time

    import yaml

    from marl.cluster import QUIET

    config = tmp_path / "pbt.yaml"
    config.write_text(yaml.safe_dump({
        "members": 2, "budget_steps": 24, "perturbation_interval": 2, "quantile_fraction": 0.5,
        "mutations": {"temperature": [0.9, 1.0]},
        "train": {"warmup_steps": 2, "warmup_episodes": 4, "episodes_per_iter": 2,
                  "group_size": 2, "eval_episodes": 4, "eval_every": 100,
                  "checkpoint_every": 1000, "transcripts_per_iter": 0}}))
    out = tmp_path / "pop"
    command = [sys.executable, "-m", "marl.cli", "population", "pbt",
               str(ROOT / "scenarios" / "signal.yaml"), "--config", str(config), "--out", str(out)]
    short = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    env = {**os.environ, **QUIET, "RAY_TMPDIR": short}
    try:
        driver = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        while not list(out.glob("members/*/reports.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.2)
        driver.send_signal(signal.SIGINT)
        output, _ = driver.communicate(timeout=120)
        assert driver.returncode == 2, output[-3000:]
        assert "did not finish" in output and "--resume" in output
        assert not json.loads((out / "population.json").read_text())["finished"]
        done = subprocess.run([*command, "--resume"], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        population = json.loads((out / "population.json").read_text())
        assert population["finished"] and [m["steps"] for m in population["members"]] == [24, 24]
    finally:
        shutil.rmtree(short, ignore_errors=True)
