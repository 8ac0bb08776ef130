import os
import sys
import textwrap
import time

import pytest
from pydantic import ValidationError

from marl.errors import MarlError
from marl.tasks.verifiers import SETTINGS, VerifierSpec, build_verifier, parse_verifier

# A valid value for every setting, and what each kind needs besides its kind.
VALUES = {"normalize": False, "tolerance": 0.1, "relative": 0.1, "pattern": "x",
          "choices_field": "options", "function": "mod:fn", "tests_field": "checks",
          "time_limit_s": 1.0, "memory_mb": 64}
REQUIRED = {"regex": {"pattern": "x"}, "python": {"function": "mod:fn"}}


def verifier(kind, **settings):
    return build_verifier(parse_verifier({"kind": kind, **settings}), "answer")


# --- the spec ------------------------------------------------------------------------------

def test_a_bare_kind_parses_and_every_setting_is_described():
    assert parse_verifier("numeric") == VerifierSpec(kind="numeric")
    assert all(field.description for field in VerifierSpec.model_fields.values())
    assert set(SETTINGS) == set(VerifierSpec.model_fields["kind"].annotation.__args__)


def test_an_unknown_kind_lists_the_kinds():
    with pytest.raises(ValidationError, match="unit_tests"):
        parse_verifier("exactly")


@pytest.mark.parametrize(("kind", "setting"), [
    (kind, setting) for kind in SETTINGS for setting in VALUES if setting not in SETTINGS[kind]])
def test_a_setting_of_another_kind_is_refused_by_name(kind, setting):
    with pytest.raises(ValidationError) as info:
        parse_verifier({"kind": kind, **REQUIRED.get(kind, {}), setting: VALUES[setting]})
    message = str(info.value)
    assert f"verifier.{setting} does not apply to kind {kind!r}" in message
    owners = [k for k, names in SETTINGS.items() if setting in names]
    assert all(repr(owner) in message for owner in owners)


@pytest.mark.parametrize(("kind", "setting"), [(k, s) for k, r in REQUIRED.items() for s in r])
def test_a_missing_required_setting_is_named(kind, setting):
    with pytest.raises(ValidationError, match=f"verifier.{setting} is required"):
        parse_verifier(kind)


@pytest.mark.parametrize(("settings", "field"), [
    ({"kind": "python", "function": "mod.fn"}, "verifier.function"),
    ({"kind": "unit_tests", "time_limit_s": 0}, "time_limit_s"),
    ({"kind": "unit_tests", "time_limit_s": 301}, "time_limit_s"),
    ({"kind": "numeric", "tolerance": -1}, "tolerance"),
    ({"kind": "exact", "normalise": True}, "normalise"),
])
def test_bad_values_are_refused_by_name(settings, field):
    with pytest.raises(ValidationError, match=field):
        parse_verifier(settings)


def test_a_bad_regex_fails_when_the_verifier_is_built():
    with pytest.raises(MarlError, match=r"verifier.pattern '\(\{answer\}' is not a valid"):
        verifier("regex", pattern="({answer}")


# --- exact, numeric, regex, choice ---------------------------------------------------------

@pytest.mark.parametrize(("answer", "reference", "normalize", "score"), [
    ("Paris", "Paris", True, 1.0),
    ("  the   CAPITAL is\nparis. ", "The capital is Paris", True, 1.0),
    ("Lyon", "Paris", True, 0.0),
    ("paris", "Paris", False, 0.0),
    ("Paris.", "Paris", False, 0.0),
    ("42", 42, True, 1.0),
])
def test_exact(answer, reference, normalize, score):
    verdict = verifier("exact", normalize=normalize)(answer, {"answer": reference})
    assert verdict.score == score and verdict.reason is None and verdict.seconds > 0


@pytest.mark.parametrize("kind", ["exact", "numeric", "choice"])
def test_a_row_without_the_reference_scores_zero_with_a_reason(kind):
    verdict = verifier(kind)("B", {"choices": ["a", "b"], "question": "?"})
    assert verdict.score == 0.0 and verdict.reason == "row has no 'answer' field"


@pytest.mark.parametrize(("answer", "reference", "settings", "score"), [
    ("so the total is 1,234.", 1234, {}, 1.0),
    ("72", "Natalia sold 48 + 24 = 72 clips.\n#### 72", {}, 1.0),
    ("it is -0.5", "-.5", {}, 1.0),
    ("first 3, then 4", 3, {}, 0.0),
    ("3.14", 3.14159, {}, 0.0),
    ("3.14", 3.14159, {"tolerance": 0.01}, 1.0),
    ("1005", 1000, {"relative": 0.01}, 1.0),
    ("1011", 1000, {"relative": 0.01}, 0.0),
])
def test_numeric(answer, reference, settings, score):
    verdict = verifier("numeric", **settings)(answer, {"answer": reference})
    assert verdict.score == score and verdict.reason is None


def test_numeric_without_a_number_scores_zero_with_a_reason():
    check = verifier("numeric")
    assert check("abc", {"answer": 3})[:2] == (0.0, "unparsable number 'abc'")
    assert check("3", {"answer": "n/a"})[:2] == (0.0, "reference 'n/a' holds no number")


@pytest.mark.parametrize(("pattern", "answer", "score"), [
    (r"(?i)\s*answer:\s*{answer}\.?", "Answer: 3.5.", 1.0),
    (r"(?i)\s*answer:\s*{answer}\.?", "Answer: 3x5", 0.0),  # the reference's '.' is literal
    (r"(?i)\s*answer:\s*{answer}\.?", "Answer: 3.5 and more", 0.0),  # the whole answer
    (r"\d+ apples", "12 apples", 1.0),  # no {answer}: the reference is not read
])
def test_regex(pattern, answer, score):
    verdict = verifier("regex", pattern=pattern)(answer, {"answer": "3.5"})
    assert verdict.score == score and verdict.reason is None


ROW = {"choices": ["Lyon", "Paris", "Nice"], "answer": "B"}


@pytest.mark.parametrize(("answer", "reference", "score"), [
    ("B", "B", 1.0), ("(b)", "B", 1.0), ("B)", "B", 1.0), ("b.", "B", 1.0),
    ("  PARIS. ", "B", 1.0), ("Paris", "Paris", 1.0), ("B", 1, 1.0), ("B", "paris", 1.0),
    ("A", "B", 0.0), ("Nice", 1, 0.0),
])
def test_choice(answer, reference, score):
    verdict = verifier("choice")(answer, {**ROW, "answer": reference})
    assert verdict.score == score and verdict.reason is None


def test_choice_without_normalisation_compares_the_text_exactly():
    check = verifier("choice", normalize=False, choices_field="options")
    row = {"options": ("Lyon", "Paris"), "answer": 1}
    assert check("Paris", row).score == 1.0
    assert check("paris", row).reason == "answer 'paris' is neither an option's letter (A-B) " \
                                         "nor its text"


@pytest.mark.parametrize(("answer", "row", "reason"), [
    ("D", ROW, "answer 'D' is neither an option's letter (A-C) nor its text"),
    ("A", {**ROW, "answer": "Berlin"}, "reference 'Berlin' names none of the 3 options in "
                                       "'choices'"),
    ("A", {**ROW, "answer": 3}, "reference '3' names none of the 3 options in 'choices'"),
    ("A", {**ROW, "choices": "Lyon;Paris"}, "row field 'choices' must be a list, got str"),
    ("A", {"answer": "A"}, "row has no 'choices' field"),
])
def test_choice_that_names_no_option_scores_zero_with_a_reason(answer, row, reason):
    verdict = verifier("choice")(answer, row)
    assert verdict.score == 0.0 and verdict.reason.startswith(reason)


# --- python --------------------------------------------------------------------------------

CHECKS = '''
NOT_CALLABLE = 3


def overlap(answer, row):
    """Partial credit: the share of the reference's words in the answer."""
    words = set(row["answer"].split())
    return len(words & set(answer.split())) / len(words)


def same(answer, row):
    return answer == row["answer"]


def boom(answer, row):
    raise ValueError("cannot read " + answer)


def too_much(answer, row):
    return 2


def one_argument(answer):
    return 1.0
'''


@pytest.fixture
def checks(tmp_path, monkeypatch):
    (tmp_path / "marl_test_checks.py").write_text(CHECKS)
    (tmp_path / "marl_test_broken.py").write_text("import marl_test_absent_dependency\n")
    monkeypatch.syspath_prepend(tmp_path)
    yield
    for name in ("marl_test_checks", "marl_test_broken"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize(("function", "answer", "verdict"), [
    ("overlap", "red green", (0.5, None)),
    ("overlap", "red green blue yellow", (1.0, None)),
    ("same", "red blue", (1.0, None)),
    ("same", "blue red", (0.0, None)),
    ("boom", "x", (0.0, "verifier raised ValueError: cannot read x")),
    ("too_much", "x", (0.0, "verifier.function returned 2 (int), not a bool or a number "
                            "in [0, 1]")),
])
def test_python(checks, function, answer, verdict):
    check = verifier("python", function=f"marl_test_checks:{function}")
    assert check(answer, {"answer": "red blue"})[:2] == verdict


@pytest.mark.parametrize(("function", "message"), [
    ("marl_test_nowhere:fn", "verifier.function 'marl_test_nowhere:fn': module "
                             "'marl_test_nowhere' not found; install the package or put its "
                             "folder on PYTHONPATH"),
    ("marl_test_checks:overlp", "module 'marl_test_checks' has no attribute 'overlp'. Did "
                                "you mean 'overlap'?"),
    ("marl_test_checks:NOT_CALLABLE", "'NOT_CALLABLE' is a int, not a function"),
    ("marl_test_checks:one_argument", "cannot be called as function(answer, row)"),
    ("marl_test_broken:fn", "importing 'marl_test_broken' failed: No module named "
                            "'marl_test_absent_dependency'"),
])
def test_python_function_that_cannot_be_used_fails_at_build(checks, function, message):
    with pytest.raises(MarlError) as info:
        verifier("python", function=function)
    assert message in str(info.value)


# --- unit_tests ----------------------------------------------------------------------------

TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0"
ADD = "def add(a, b):\n    return a + b\n"


def run(solution, tests=TESTS, **settings):
    return verifier("unit_tests", **settings)(textwrap.dedent(solution), {"tests": tests})


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    """Point tempfile at an empty folder, to count what the sandbox leaves behind."""
    root = tmp_path / "temp"
    root.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(root))
    return root


def test_a_correct_solution_passes(temp_root):
    verdict = run(ADD)
    assert verdict.score == 1.0 and verdict.reason is None and verdict.seconds > 0
    assert run(f"```python\n{ADD}```\n").score == 1.0
    assert list(temp_root.iterdir()) == []


def test_a_wrong_solution_fails_naming_the_assertion():
    verdict = run("def add(a, b):\n    return a - b\n")
    assert verdict.score == 0.0
    assert verdict.reason == "tests failed: AssertionError (tests.py line 1: assert add(2, 3) == 5)"


def test_an_infinite_loop_is_stopped_at_the_time_limit(temp_root):
    start = time.perf_counter()
    verdict = run("while True:\n    pass\n", time_limit_s=1)
    assert verdict[:2] == (0.0, "time limit 1 s exceeded")
    assert time.perf_counter() - start < 5
    assert list(temp_root.iterdir()) == []


@pytest.mark.parametrize(("solution", "reason"), [
    ("raise SystemExit(3)", "solution failed: SystemExit: 3 (solution.py line 1"),
    ("1/0", "solution failed: ZeroDivisionError: division by zero (solution.py line 1: 1/0)"),
    ("def add(a, b) return a", "solution failed: SyntaxError"),
    ("import sys\nsys.exit(0)", "solution failed: SystemExit: 0"),  # before the tests ran
    ("import os\nos._exit(0)", "exited with status 0 before the tests finished"),
    ("def add(a, b):\n    return add(a, b)", "tests failed: RecursionError"),
    ("import numpy", "solution failed: ModuleNotFoundError"),  # the standard library only
])
def test_a_crashing_solution_fails_with_the_reason(solution, reason):
    verdict = run(solution)
    assert verdict.score == 0.0 and verdict.reason.startswith(reason)


OUTSIDE = [  # (code run against the paths P (absent), Q (a file), D (a folder), what holds)
    ("open(P, 'w').write('x')", lambda p, q, d: not p.exists()),
    ("try:\n    open(P, 'w')\nexcept OSError:\n    pass", lambda p, q, d: not p.exists()),
    ("os.remove(Q)", lambda p, q, d: q.read_text() == "keep"),
    ("os.rename(Q, P)", lambda p, q, d: q.exists() and not p.exists()),
    ("os.truncate(Q, 0)", lambda p, q, d: q.read_text() == "keep"),
    ("os.mkdir(P)", lambda p, q, d: not p.exists()),
    ("shutil.rmtree(D)", lambda p, q, d: (d / "inner.txt").exists()),
    ("shutil.copyfile('solution.py', P)", lambda p, q, d: not p.exists()),
    ("os.symlink(Q, 'link')", lambda p, q, d: True),
]


@pytest.mark.parametrize(("code", "holds"), OUTSIDE)
def test_changing_files_outside_the_sandbox_is_refused(tmp_path, code, holds):
    p, q, d = tmp_path / "escaped.txt", tmp_path / "kept.txt", tmp_path / "folder"
    q.write_text("keep")
    d.mkdir()
    (d / "inner.txt").write_text("keep")
    solution = f"import os, shutil\nP, Q, D = {str(p)!r}, {str(q)!r}, {str(d)!r}\n{code}\n{ADD}"
    verdict = run(solution)
    assert verdict.score == 0.0 and verdict.reason.startswith("refused: ")
    assert holds(p, q, d)


def test_files_inside_the_sandbox_may_be_written_and_are_removed_after(temp_root):
    solution = f"""
        import os, tempfile
        open("notes.txt", "w").write("x")
        os.makedirs("a/b")
        os.rename("notes.txt", "a/notes.txt")
        tempfile.mkstemp()
        os.mkdir("locked")
        os.chmod("locked", 0)
        {ADD}"""
    assert run(solution.replace("\n        ", "\n")).score == 1.0
    assert list(temp_root.iterdir()) == []


@pytest.mark.parametrize(("solution", "reason"), [
    ("import socket\nsocket.create_connection(('127.0.0.1', 9))", "refused: network access"),
    ("import socket\nsocket.socket()", "refused: network access"),
    ("import urllib.request\nurllib.request.urlopen('http://localhost:9')",
     "refused: network access"),
    ("import subprocess\nsubprocess.run(['true'])", "refused: starting programs"),
    ("import os\nos.system('true')", "refused: starting programs"),
    ("import os\nos.execv('/bin/true', ['true'])", "refused: starting programs"),
    ("import os\nos.fork()", "refused: forking"),
    ("import multiprocessing as mp\nmp.get_context('spawn').Process(target=print).start()",
     "refused: starting programs"),
    ("import os\nos.kill(os.getppid(), 0)", "refused: signalling processes"),
    ("import ctypes", "refused: ctypes"),
    ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
     "refused: changing limits"),
])
def test_network_processes_and_ctypes_are_refused(solution, reason):
    verdict = run(f"{solution}\n{ADD}")
    assert verdict.score == 0.0 and verdict.reason.startswith(reason)


def test_asyncio_still_works():
    solution = f"import asyncio\nasync def one():\n    return 1\n" \
               f"assert asyncio.run(one()) == 1\n{ADD}"
    assert run(solution).score == 1.0


def test_a_solution_beyond_the_memory_limit_fails():
    verdict = run(f"data = bytearray(2**30)\n{ADD}", memory_mb=64)
    assert verdict[:2] == (0.0, "memory limit 64 MB exceeded")


def test_the_environment_is_minimal(monkeypatch):
    monkeypatch.setenv("MARL_TEST_SECRET", "hunter2")
    solution = f"""
        import os, sys
        # LC_CTYPE: the interpreter's own C-locale coercion (PEP 538) may set it
        assert set(os.environ) - {{"LC_CTYPE"}} == {{"PATH", "PYTHONHASHSEED",
                                   "PYTHONDONTWRITEBYTECODE", "TMPDIR"}}, sorted(os.environ)
        assert sys.flags.hash_randomization == 0 and sys.flags.no_site
        assert os.environ["TMPDIR"] == os.getcwd()
        {ADD}"""
    verdict = run(solution.replace("\n        ", "\n"))
    assert verdict[:2] == (1.0, None)


def test_lingering_threads_do_not_hold_the_verdict():
    solution = f"import threading, time\n" \
               f"threading.Thread(target=time.sleep, args=(60,)).start()\n{ADD}"
    verdict = run(solution, time_limit_s=10)
    assert verdict.score == 1.0 and verdict.seconds < 10


UNITTEST = """
import unittest

class TestAdd(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

unittest.main()
"""


@pytest.mark.parametrize(("solution", "tests", "score"), [
    (ADD, UNITTEST, 1.0),
    ("def add(a, b):\n    return 0\n", UNITTEST, 0.0),
    (ADD, ["assert add(2, 3) == 5", "assert add(0, 0) == 0"], 1.0),  # MBPP's test_list
    (ADD, "import sys\nassert add(1, 1) == 2\nsys.exit(0)", 1.0),
    (ADD, "from solution import add as plus\nassert plus(1, 1) == 2", 1.0),
])
def test_test_styles(solution, tests, score):
    assert run(solution, tests).score == score


@pytest.mark.parametrize(("row", "reason"), [
    ({"question": "?"}, "row has no 'tests' field"),
    ({"tests": ["assert True", 3]}, "row field 'tests' must be Python code"),
    ({"tests": 3}, "row field 'tests' must be a list, got int"),
])
def test_rows_without_usable_tests_score_zero_with_a_reason(row, reason):
    verdict = verifier("unit_tests")(ADD, row)
    assert verdict.score == 0.0 and verdict.reason.startswith(reason)


def test_the_sandbox_process_runs_in_its_own_folder(temp_root):
    solution = f"import os\nHERE = os.getcwd()\n{ADD}"
    tests = f"assert HERE.startswith({str(temp_root)!r}) and HERE != {os.getcwd()!r}"
    assert run(solution, tests)[:2] == (1.0, None)
