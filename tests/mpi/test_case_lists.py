"""The case lists come from the scripts: every script under tests/mpi/scripts/
that reports cases declares them (its @case functions and its CASES table),
every name it reports is declared, and the pytest files read the names with
launching.case_names instead of copying them. Read from the syntax trees; no
launch. A launch that reports an undeclared case, or a selection naming an
unknown one, fails at run time too (launching.CaseRun, Launcher.cases): the
last tests show both checks failing on bad input."""

import ast
import glob
import os
import subprocess

import pytest
from launching import SCRIPTS_DIR, TESTS_DIR, CaseRun, Launcher, case_names, declared_cases

SCRIPTS = sorted(p for p in glob.glob(os.path.join(SCRIPTS_DIR, "*.py"))
                 if os.path.basename(p) != "harness.py")
TEST_FILES = sorted(glob.glob(os.path.join(TESTS_DIR, "mpi", "test_*.py"))
                    + glob.glob(os.path.join(TESTS_DIR, "cluster", "test_*.py")))
REPORTING = ("report", "run_cases", "case")


def reports_cases(path):
    """Whether a script imports the harness's reporting (it prints DDLCASE lines)."""
    tree = ast.parse(open(path).read(), path)
    return any(isinstance(n, ast.ImportFrom) and n.module == "harness"
               and any(a.name in REPORTING for a in n.names) for n in ast.walk(tree))


def literal_reports(path):
    """The case names a script passes to report() as string literals."""
    tree = ast.parse(open(path).read(), path)
    return [n.args[0].value for n in ast.walk(tree)
            if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "report" and n.args
            and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)]


def undeclared_reports(path):
    return sorted(set(literal_reports(path)) - set(case_names(path)))


def copied_case_lists(path, declared):
    """Literal lists or tuples of strings in a test file that hold every case
    of a script (``declared``: {script: names}): a copy by hand, which a new
    case would not join. A subset is a selection the test chose on purpose
    (runs only those, checked by Launcher.cases)."""
    tree = ast.parse(open(path).read(), path)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.List, ast.Tuple)) or len(node.elts) < 2:
            continue
        if not all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            continue
        names = {e.value for e in node.elts}
        found += [f"{os.path.basename(path)}:{node.lineno} copies {script}'s cases"
                  for script, cases in declared.items() if cases and names >= set(cases)]
    return found


def scripts_named(path):
    """Script file names a test file mentions in string literals."""
    tree = ast.parse(open(path).read(), path)
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and n.value.endswith(".py")}


@pytest.mark.parametrize("script", [os.path.basename(p) for p in SCRIPTS if reports_cases(p)])
def test_every_reporting_script_declares_its_cases(script):
    functions, table = declared_cases(os.path.join(SCRIPTS_DIR, script))
    names = functions + (table or [])
    assert names, f"{script} reports cases but declares none (@case functions or CASES)"
    assert len(names) == len(set(names)), f"{script} declares a case twice: {names}"
    assert undeclared_reports(os.path.join(SCRIPTS_DIR, script)) == []


def test_the_pytest_files_do_not_copy_case_lists_and_every_script_is_run():
    declared = {os.path.basename(p): case_names(p) for p in SCRIPTS if reports_cases(p)}
    copies = [c for path in TEST_FILES for c in copied_case_lists(path, declared)]
    assert copies == [], "use launching.case_names(SCRIPT) instead:\n" + "\n".join(copies)
    named = set().union(*(scripts_named(p) for p in TEST_FILES))
    assert sorted(set(declared) - named) == [], "case scripts no pytest file launches"


def test_the_checks_would_fail(tmp_path):
    script = tmp_path / "job.py"
    script.write_text('from harness import report\nCASES = ("a", "b")\n\n\n'
                      'def main():\n    report("a", 0, True)\n    report("c", 0, True)\n')
    assert reports_cases(str(script)) and case_names(str(script)) == ["a", "b"]
    assert undeclared_reports(str(script)) == ["c"]
    tests = tmp_path / "test_job.py"
    tests.write_text('import pytest\n\n\n@pytest.mark.parametrize("name", ["a", "b"])\n'
                     'def test_job(launcher, name):\n    pass\n\n\nSELECTION = ["a", "x"]\n')
    assert copied_case_lists(str(tests), {"job.py": ["a", "b"]}) == \
        ["test_job.py:4 copies job.py's cases"]
    # At run time: an undeclared case fails every check of the launch, and a
    # selection naming an unknown case fails before launching.
    stdout = ('DDLCASE {"case": "a", "rank": 0, "ok": true, "detail": ""}\n'
              'DDLCASE {"case": "c", "rank": 0, "ok": true, "detail": ""}\n')
    run = CaseRun(1, subprocess.CompletedProcess([], 0, stdout, ""), str(script))
    with pytest.raises(AssertionError, match=r"does not declare.*\['c'\]"):
        run.check("a")
    with pytest.raises(AssertionError, match=r"declares no cases \['x'\]"):
        Launcher().cases(1, str(script), cases=("a", "x"))
