"""The child process of :mod:`marl.tasks.sandbox`: copied into each sandbox folder as
``sandbox.py`` and run there as ``python -s -S sandbox.py MEMORY_MB CPU_S``. It sets its own
limits, installs the audit-hook guard, then runs ``solution.py`` and ``tests.py``. Lines
starting with ``MARK`` on stderr tell the parent what happened. Standard library only (it
runs without site-packages); importing it does nothing."""

import os
import resource
import signal
import sys
import traceback
import types

MARK = "marl-sandbox: "
ROOT = os.getcwd()
WRITES = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
REFUSED = {"subprocess.Popen": "starting programs", "os.system": "starting programs",
           "os.exec": "starting programs", "os.spawn": "starting programs",
           "os.posix_spawn": "starting programs", "os.fork": "forking",
           "os.forkpty": "forking", "os.kill": "signalling processes",
           "os.killpg": "signalling processes", "resource.setrlimit": "changing limits",
           "resource.prlimit": "changing limits", "os.symlink": "creating links",
           "os.link": "creating links"}
# event -> (position of a path it changes, position of that path's dir_fd or None), ...
CHANGES = {"os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),),
           "os.rename": ((0, 2), (1, 3)), "os.chmod": ((0, 2),), "os.chown": ((0, 3),),
           "os.utime": ((0, 3),), "os.truncate": ((0, None),), "os.setxattr": ((0, None),),
           "os.removexattr": ((0, None),)}


def refuse(what, *_):
    os.write(2, f"\n{MARK}refused: {what}\n".encode("utf-8", "replace"))
    raise PermissionError(f"refused by the verifier's sandbox: {what}")


def inside(path, dir_fd=None):
    try:
        if isinstance(path, int):
            path = os.readlink(f"/proc/self/fd/{path}")
        path = os.fsdecode(path)
        if dir_fd not in (None, -1) and not os.path.isabs(path):
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        return os.path.realpath(path).startswith(ROOT + os.sep)
    except (OSError, TypeError, ValueError):
        return False


def guard(event, args):
    if event == "open":
        if args[2] & WRITES and not isinstance(args[0], int) and not inside(args[0]):
            refuse(f"writing {args[0]!r} outside the sandbox folder")
    elif event in CHANGES:
        for at, fd_at in CHANGES[event]:
            if not inside(args[at], None if fd_at is None else args[fd_at]):
                refuse(f"changing {args[at]!r} outside the sandbox folder ({event})")
    elif event in REFUSED:
        refuse(f"{REFUSED[event]} ({event})")
    elif event.startswith("socket.") and not (event == "socket.__new__" and args[1] == 1):
        refuse(f"network access ({event})")
    elif event.startswith("ctypes."):
        refuse(f"ctypes, which could bypass the sandbox ({event})")


def limit(memory_mb, cpu_s):
    for which, value in ((resource.RLIMIT_AS, memory_mb * 2**20),
                         (resource.RLIMIT_FSIZE, 8 * 2**20), (resource.RLIMIT_NOFILE, 64),
                         (resource.RLIMIT_CORE, 0), (resource.RLIMIT_CPU, cpu_s)):
        hard = resource.getrlimit(which)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails, not kills


def summary(phase, exc):
    try:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        ours = [f for f in traceback.extract_tb(exc.__traceback__)
                if f.filename in ("solution.py", "tests.py")]
        if ours:
            text += f" ({ours[-1].filename} line {ours[-1].lineno}: {ours[-1].line})"
    except BaseException:
        text = type(exc).__name__
    return f"{phase} failed: " + " ".join(text.split())[:300]


def main():
    sources = {}
    for name in ("solution.py", "tests.py"):
        with open(name, encoding="utf-8") as file:
            sources[name] = file.read()
    limit(int(sys.argv[1]), int(sys.argv[2]))
    sys.argv[:] = ["tests.py"]  # unittest.main() would read the limits as test names
    import _posixsubprocess
    _posixsubprocess.fork_exec = lambda *_: refuse("starting programs (fork_exec)")
    sys.addaudithook(guard)
    phase = "solution"
    try:
        solution = sys.modules["solution"] = types.ModuleType("solution")
        solution.__file__ = os.path.join(ROOT, "solution.py")
        exec(compile(sources["solution.py"], "solution.py", "exec"), vars(solution))
        phase = "tests"
        tests = sys.modules["__main__"] = types.ModuleType("__main__")
        vars(tests).update((k, v) for k, v in vars(solution).items() if k[:2] != "__")
        tests.__file__ = os.path.join(ROOT, "tests.py")
        try:
            exec(compile(sources["tests.py"], "tests.py", "exec"), vars(tests))
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
    except BaseException as exc:
        os.write(2, f"\n{MARK}{summary(phase, exc)}\n".encode("utf-8", "replace"))
        try:
            traceback.print_exception(type(exc), exc, exc.__traceback__)
        finally:
            os._exit(1)
    sys.stdout.flush()
    os.write(2, f"\n{MARK}passed\n".encode())
    os._exit(0)  # now: lingering threads or atexit hooks of the solution must not run


if __name__ == "__main__":
    main()
