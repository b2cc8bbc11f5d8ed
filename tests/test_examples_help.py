"""Every example answers --help: exit 0, a help text for every option and
argument, and nothing written (no output directory named "--help")."""

import os
import re
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
# imagenet_common.py is the ResNet scripts' shared module, not a program.
SCRIPTS = sorted(f for f in os.listdir(EXAMPLES)
                 if f.endswith(".py") and f != "imagenet_common.py")


def entries_without_help(help_text):
    """The option/argument entries of an argparse help text that have no
    description (on their line, or indented on the lines below)."""
    lines = help_text.splitlines()
    bare = []
    in_section = False
    for i, line in enumerate(lines):
        if re.match(r"^(options|optional arguments|positional arguments):", line):
            in_section = True
            continue
        if not line.startswith(" "):  # a blank line or a heading ends the section
            in_section = False
            continue
        if not in_section:
            continue
        m = re.match(r"^  (\S.*?)(\s{2,}(\S.*))?$", line)
        if not m or line.startswith("   "):
            continue  # a continuation line of the entry above
        has_text = m.group(3) is not None
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if not has_text and not re.match(r"^\s{6,}\S", following):
            bare.append(m.group(1))
    return bare


def test_the_checker_finds_a_bare_option():
    text = ("usage: x\n\noptions:\n  -h, --help  show this help message and exit\n"
            "  --epochs EPOCHS\n  --seed SEED           seed\n  --long-option-name LONG\n"
            "                        its help\n")
    assert entries_without_help(text) == ["--epochs EPOCHS"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_is_complete_and_writes_nothing(script, tmp_path):
    before = sorted(os.listdir(EXAMPLES))
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), "--help"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
                                   TF_CPP_MIN_LOG_LEVEL="3", COLUMNS="100"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    assert text.startswith("usage: "), text[:500]
    entries = re.findall(r"^  (-?-?[\w-]+)", text, re.M)
    assert "-h" in entries and len(entries) >= 2, text   # real options, not only -h
    assert entries_without_help(text) == [], text
    assert os.listdir(tmp_path) == [], "--help wrote files"
    assert sorted(os.listdir(EXAMPLES)) == before


def test_large_batch_study_writes_a_new_directory_unless_told(capsys):
    sys.path.insert(0, EXAMPLES)
    try:
        import large_batch_study as study
    finally:
        sys.path.remove(EXAMPLES)
    out = study.parse_args([]).out
    assert re.fullmatch(r"large_batch_study-\d{8}-\d{6}", out), out
    assert not os.path.exists(out)            # parsing made nothing
    assert study.parse_args(["--out", "docs/large_batch"]).out == "docs/large_batch"
    with pytest.raises(SystemExit):
        study.parse_args(["--resume"])
    assert "--resume needs --out DIR" in capsys.readouterr().err


def test_large_batch_study_refuses_several_ranks(tmp_path):
    env = dict(os.environ, PMI_SIZE="2", PMI_RANK="0", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, "large_batch_study.py"),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 1 and "runs on one process" in proc.stderr, proc.stderr
    assert not os.path.exists(tmp_path / "out")
