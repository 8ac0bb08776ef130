"""The sandbox of the ``unit_tests`` verifier (:mod:`marl.tasks.verifiers`): run a code
answer against its row's tests in a separate, limited process.

Each answer runs in a fresh temporary folder (removed afterwards, always) in a new
process ``python -s -S`` (no site-packages: the standard library only) in a new session,
with: the folder as working directory and ``TMPDIR``; an environment of ``PATH``,
``PYTHONHASHSEED=0`` and ``PYTHONDONTWRITEBYTECODE=1`` only (no inherited secrets);
stdin and stdout discarded; resource limits (address space ``memory_mb``, CPU time
``ceil(time_limit_s) + 1`` s, files and stderr 8 MB, 64 descriptors, no core dumps); and a
wall-clock limit of ``time_limit_s`` after which its process group is killed. Before
the solution runs, an audit hook (``sys.addaudithook``; it cannot be removed) refuses:
network access (every ``socket.*`` event except creating a local AF_UNIX socket, which
``asyncio`` needs for its event loop); starting programs and forking
(``subprocess.Popen``, ``os.system``, ``os.exec*``, ``os.spawn*``, ``os.posix_spawn``,
``os.fork``, ``os.forkpty``, and ``_posixsubprocess.fork_exec``, which raises no event
and is replaced); signalling processes (``os.kill``, ``os.killpg``); ``ctypes``, which
could undo all of this; changing resource limits; creating links; and writing,
creating, removing, renaming or changing the mode, owner or times of any path outside
the folder (``open`` with a write flag, ``os.remove``, ``os.rename``, ``os.mkdir``,
``os.rmdir``, ``os.chmod``, ``os.chown``, ``os.utime``, ``os.truncate``, extended
attributes; ``shutil`` goes through these). A refused operation fails the answer
even if the code catches the ``PermissionError``. Reasons: ``tests failed:
AssertionError (tests.py line 2: assert add(-1, 1) == 0)``, ``solution failed:
ZeroDivisionError: division by zero (...)``, ``time limit 5 s exceeded``, ``memory
limit 256 MB exceeded``, ``refused: network access (socket.connect)``.

The sandbox guards against accidents and careless model output; it is not a security
boundary against deliberately hostile code: run untrusted code sets inside a container
or VM. Network isolation is by the audit hook, not a network namespace. Reading files
is not restricted (the solution can read what the user can, and print it into the
reason). Code that goes looking for the guard (``gc``, frames) can disable it;
``os.mkfifo`` and ``os.mknod`` raise no audit event, nor does ``os.open`` reveal a
``dir_fd`` it writes relative to. The memory limit is on address space, not resident
memory: threads reserve address space, so threaded solutions need more. The sandbox
needs a POSIX system; paths given relative to a ``dir_fd`` are resolved through
``/proc`` and refused where there is none.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

#: The child script (standard library only), copied into every sandbox folder.
CHILD = Path(__file__).with_name("sandbox_child.py")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


# The sandbox's child: limits, then the guard, then solution.py and tests.py. It runs with
# no site-packages, so it uses the standard library only. Lines starting with MARK on
# stderr tell the parent what happened. The child sets its own limits, before any of the
# solution runs, rather than a preexec_fn: that is unsafe in a threaded parent (a training
# process is one) and would rule out vfork.
_MARK = "marl-sandbox: "


def run_tests(solution: str, tests: str, time_limit_s: float,
              memory_mb: int) -> tuple[float, str | None]:
    """Run ``solution`` then ``tests`` in the sandbox: ``(1.0, None)`` or ``(0.0, reason)``."""
    folder = tempfile.mkdtemp(prefix="marl-verify-")
    try:
        for name, text in (("sandbox.py", CHILD.read_text()), ("solution.py", solution),
                           ("tests.py", tests)):
            Path(folder, name).write_text(text, encoding="utf-8")
        env = {"PATH": os.environ.get("PATH", os.defpath), "PYTHONHASHSEED": "0",
               "PYTHONDONTWRITEBYTECODE": "1", "TMPDIR": folder}
        with tempfile.TemporaryFile() as stderr:  # a file, so the size limit bounds it
            # -s -S rather than -I, which would also drop PYTHONHASHSEED; the environment is
            # built from scratch, so no PYTHONPATH or other PYTHON* setting reaches it.
            child = subprocess.Popen(
                [sys.executable, "-s", "-S", "sandbox.py", str(memory_mb),
                 str(math.ceil(time_limit_s) + 1)],
                cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=stderr, start_new_session=True)
            try:
                child.wait(timeout=time_limit_s)
            except subprocess.TimeoutExpired:
                return 0.0, f"time limit {time_limit_s:g} s exceeded"
            finally:
                if child.returncode is None:  # timed out, or this thread was interrupted
                    os.killpg(child.pid, signal.SIGKILL)
                    child.wait()
            stderr.seek(0)
            log = stderr.read().decode("utf-8", "replace")
        return _judge(child.returncode, log, time_limit_s, memory_mb)
    finally:
        _remove_tree(folder)


def _judge(returncode: int, log: str, time_limit_s: float,
           memory_mb: int) -> tuple[float, str | None]:
    """Score a finished child from its exit status and the MARK lines of its stderr."""
    lines = [line for line in log.splitlines() if line.strip()]
    marks = [line.removeprefix(_MARK) for line in lines if line.startswith(_MARK)]
    refused = [mark for mark in marks if mark.startswith("refused: ")]
    failed = [mark for mark in marks if " failed: " in mark]
    if refused:
        return 0.0, refused[0]
    if returncode == 0 and "passed" in marks:
        return 1.0, None
    last = failed[-1] if failed else lines[-1] if lines else ""
    if "MemoryError" in last:
        return 0.0, f"memory limit {memory_mb} MB exceeded"
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return 0.0, f"time limit {time_limit_s:g} s exceeded (CPU time)"
    if failed:
        return 0.0, failed[-1]
    if returncode < 0:
        return 0.0, f"killed by {signal.Signals(-returncode).name}"
    last = f": {_clip(last, 200)}" if last else ""
    return 0.0, f"exited with status {returncode} before the tests finished{last}"


def _remove_tree(folder: str) -> None:
    """Remove a sandbox folder, unlocking subfolders the solution may have chmod-ed first."""
    for parent, dirs, _ in os.walk(folder):
        for name in dirs:
            if not os.path.islink(os.path.join(parent, name)):
                os.chmod(os.path.join(parent, name), 0o700)
    shutil.rmtree(folder)
