"""Every example answers --help: exit 0, a description in whole sentences,
a help text for every option and argument, and nothing written (no output
directory named "--help")."""

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples")
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


# A paragraph of prose ends a sentence: with . ? ! or a colon that
# introduces what follows, optionally inside a closing parenthesis or quote.
SENTENCE_END = re.compile(r"[.?!:][)\"']*$")
# An item of a numbered or bulleted list: its indented lines continue it.
LIST_ITEM = re.compile(r"^(\d+\.|[-*]) ")


def description_paragraphs(help_text):
    """The prose paragraphs of an argparse help text's description and
    epilog: runs of non-blank lines that start at the margin, after the
    usage block, outside the argument groups. Indented lines (commands,
    tables, argument entries) are not prose and end a paragraph."""
    lines = help_text.splitlines()
    at = 0
    while at < len(lines) and lines[at].strip():  # the usage block
        at += 1
    paragraphs, current, in_group = [], [], False
    for line in lines[at:] + [""]:
        group_heading = re.match(r"^[A-Za-z][\w ]*:$", line) is not None
        if current and LIST_ITEM.match(current[0]) and line.startswith(" ") and line.strip():
            current.append(line.strip())  # a list item's continuation line
            continue
        if current and LIST_ITEM.match(line):
            paragraphs.append(" ".join(current))  # the next item
            current = []
        if not line.strip() or line.startswith(" ") or group_heading:
            if current:
                paragraphs.append(" ".join(current))
                current = []
            if group_heading:
                in_group = True
            elif not line.startswith(" "):
                in_group = False if not line.strip() else in_group
            continue
        if not in_group:
            current.append(line.strip())
    return paragraphs


def cut_paragraphs(help_text):
    """The description's paragraphs that are not whole sentences: empty
    (no description at all), starting in lower case, or ending
    mid-sentence."""
    paragraphs = description_paragraphs(help_text)
    if not paragraphs:
        return ["(no description)"]
    def whole(p):
        p = LIST_ITEM.sub("", p)
        aside = p.startswith("(") and p.endswith(")")  # a parenthetical remark
        return (aside or SENTENCE_END.search(p)) and (p[0].isupper() or p[0] in "(`'\"")

    return [p for p in paragraphs if not whole(p)]


def test_the_sentence_checker_finds_a_cut_description():
    cut = ("usage: autotune_allreduce.py [-h] [--calls CALLS]\n\n"
           "Repeated allreduces of one gradient-sized tensor, for watching the\n\n"
           "options:\n  -h, --help     show this help message and exit\n")
    assert cut_paragraphs(cut) == [
        "Repeated allreduces of one gradient-sized tensor, for watching the"]
    whole = ("usage: x.py [-h]\n                [--long LONG]\n\nTrains a model. On N ranks:\n\n"
             "    mpiexec -n 2 python x.py\n\n(without --out, nothing is written)\n\n"
             "1. A list item\n   goes on here.\n2. And a second\n   item.\n\n"
             "options:\n  -h, --help  show this help message and exit\n  --long LONG  a "
             "fragment is fine here\n\nThe epilog is prose too.\n")
    assert description_paragraphs(whole) == [
        "Trains a model. On N ranks:", "(without --out, nothing is written)",
        "1. A list item goes on here.", "2. And a second item.", "The epilog is prose too."]
    assert cut_paragraphs(whole) == []
    assert cut_paragraphs("usage: x.py [-h]\n\noptions:\n  -h, --help  help\n") == [
        "(no description)"]


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
    assert cut_paragraphs(text) == [], f"not whole sentences: {cut_paragraphs(text)}\n{text}"
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


def test_autotune_example_runs_long_enough_for_the_tuner_by_default():
    """examples/autotune_allreduce.py's default call count covers both
    phases of DDL_AUTOTUNE=1 with the library's own defaults
    (custom_ops/common/config.h), and follows the environment."""
    sys.path.insert(0, EXAMPLES)
    try:
        import autotune_allreduce as example
    finally:
        sys.path.remove(EXAMPLES)
    with open(os.path.join(os.path.dirname(EXAMPLES), "custom_ops", "common", "config.h")) as f:
        config = f.read()
    steps = int(re.search(r"int autotune_steps = (\d+);", config).group(1))
    cycles = int(re.search(r"int autotune_cycles = (\d+);", config).group(1))
    assert (example.DEFAULT_STEPS, example.DEFAULT_CYCLES) == (steps, cycles)
    # The most a size class tries: 5 algorithms, 7 settings; the call that
    # closes the last window; then the calls with the choice.
    needed = steps * 5 + steps * 7 * cycles + 1
    assert example.calls_to_finish({}) == needed + example.CALLS_AFTER_TUNING
    assert example.calls_to_finish({"DDL_AUTOTUNE_STEPS": "2", "DDL_AUTOTUNE_CYCLES": "1"}) == (
        2 * 5 + 2 * 7 + 1 + example.CALLS_AFTER_TUNING)
    assert example.parse_args([]).calls == example.calls_to_finish(os.environ)
