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
