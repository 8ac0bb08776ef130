"""An API team against a real OpenAI-compatible server: vLLM's own, serving a tiny Llama
on 127.0.0.1, started by the test. The ledger must hold what the server billed: the
summary's tokens equal the server's own counters (its Prometheus ``/metrics``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import yaml
from typer.testing import CliRunner

from marl.cli import app
from marl.policies.hf_local import build_tiny_hf
from tests.marl.conftest import ROOT

if not os.environ.get("CI"):  # CI installs the extras: there a missing one fails
    pytest.importorskip("vllm", reason="the vllm extra: pip install -e '.[vllm]'")
    pytest.importorskip("httpx", reason="the api extra: pip install -e '.[api]'")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - 127.0.0.1 only
        return r.read().decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``vllm.entrypoints.openai.api_server`` on a free local port; stopped after."""
    tmp = tmp_path_factory.mktemp("vllm_server")
    model = build_tiny_hf(tmp / "llama", hidden_size=64, num_heads=2, chat_template=True)
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(tmp / "cache"),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    log = (tmp / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
         "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
         "--kv-cache-memory-bytes", str(64 * 2**20)], env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the vLLM server exited: {(tmp / 'server.log').read_text()[-3000:]}")
        try:
            _get(f"{base}/v1/models")
            break
        except OSError:
            time.sleep(1)
    else:
        proc.kill()
        pytest.fail("the vLLM server did not start within 240 s")
    yield base
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _counters(base: str) -> dict[str, float]:
    """The server's own token counters."""
    out = {}
    for line in _get(f"{base}/metrics").splitlines():
        for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
            if line.startswith(name):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _api_run(tmp_path, base_url: str, api: str = "chat", **settings):
    """``marl run`` of 6 gather_star episodes with every policy on ``base_url``."""
    data = yaml.safe_load((ROOT / "scenarios" / "gather_star.yaml").read_text())
    data["policies"] = {name: {"backend": "openai", "model": "tiny", "api": api,
                               "base_url": base_url, "max_new_tokens": 6,
                               "max_concurrency": 4, **settings}
                        for name in data["policies"]}
    scenario = tmp_path / "gather_api.yaml"
    scenario.write_text(yaml.safe_dump(data))
    return CliRunner().invoke(app, ["run", str(scenario), "--episodes", "6", "--out",
                                    str(tmp_path / "run")])


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_the_ledger_holds_what_the_server_billed(server, tmp_path, api):
    before = _counters(server)
    res = _api_run(tmp_path, f"{server}/v1", api)
    assert res.exit_code == 0, res.output
    after = _counters(server)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    episodes = [json.loads(x) for x in
                (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 6 and not any("error" in e for e in episodes)
    tokens = summary["tokens_per_episode"]
    billed_prompt = after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"]
    billed_out = (after["vllm:generation_tokens_total"]
                  - before["vllm:generation_tokens_total"])
    assert tokens["prompt"] * 6 == pytest.approx(billed_prompt)
    assert tokens["completion"] * 6 == pytest.approx(billed_out)
    assert billed_out > 0 and summary["cost_usd_per_episode"] > 0


@pytest.mark.parametrize("name", ["arith_chain", "arith_star", "code_chain", "code_debate"])
def test_a_dataset_team_on_the_server_is_billed_what_the_ledger_holds(server, tmp_path, name):
    """The shipped dataset scenarios (free-form messages, verifiers) played by an API team:
    every episode scored, the ledger equal to the server's counters."""
    data = yaml.safe_load((ROOT / "scenarios" / f"{name}.yaml").read_text())
    for spec in data["policies"].values():
        spec.update(backend="openai", model="tiny", base_url=f"{server}/v1",
                    max_new_tokens=24, max_concurrency=4)
    scenario = tmp_path / f"{name}_api.yaml"
    scenario.write_text(yaml.safe_dump(data))
    before = _counters(server)
    res = CliRunner().invoke(app, ["run", str(scenario), "--episodes", "4", "--out",
                                   str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    after = _counters(server)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["failed_episodes"] == 0 and summary["split"] == "eval"
    assert summary["verify_s_total"] > 0
    tokens = summary["tokens_per_episode"]
    assert tokens["prompt"] * 4 == pytest.approx(
        after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"])
    assert tokens["completion"] * 4 == pytest.approx(
        after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"])


class _FaultProxy:
    """Forwards requests to ``upstream`` but answers every third one (n % 3 == 1) with 429
    and ``Retry-After: 0`` instead: a rate-limited real server."""

    def __init__(self, upstream: str):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        proxy = self
        self.upstream, self.seen, self.refused = upstream, 0, 0
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with proxy.lock:
                    n, proxy.seen = proxy.seen, proxy.seen + 1
                    refuse = n % 3 == 1
                    proxy.refused += refuse
                if refuse:
                    self.send_response(429)
                    self.send_header("Retry-After", "0")
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                    return
                req = urllib.request.Request(proxy.upstream + self.path, data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - 127.0.0.1
                    data = r.read()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_third_of_requests_rate_limited_still_plays_every_episode(server, tmp_path):
    """429 with Retry-After on every third request (a fault proxy in front of the real
    server): retried, every episode played, and only what was served is billed."""
    proxy = _FaultProxy(server)
    try:
        before = _counters(server)
        res = _api_run(tmp_path, proxy.url, max_retries=4)
        after = _counters(server)
    finally:
        proxy.close()
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    episodes = [json.loads(x) for x in
                (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 6 and not any("error" in e for e in episodes)
    assert summary["failed_episodes"] == 0
    calls = 6 * 4  # four agents, one round
    assert proxy.refused >= calls // 3 and summary["api_retries"] == proxy.refused
    billed = after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"]
    assert summary["tokens_per_episode"]["prompt"] * 6 == pytest.approx(billed)
