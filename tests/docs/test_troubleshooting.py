"""docs/troubleshooting.md has an entry for every family of messages that
keras_ddl prints or raises.

How the messages are collected (tests/docs/message_families.py), without
running anything:

- Python (keras_ddl/, and the test cluster's runner): from the syntax tree,
  every `raise X(...)`, `warnings.warn(...)`, `sys.stderr.write(...)`,
  `print(..., file=sys.stderr)` and `parser.error(...)`, and the calls of
  helpers that pass a message parameter on to one of those. The message
  argument is read as a template: literal text, with "…" for f-string
  fields and other values; a variable is followed to its last assignment
  in the function.
- C++ (custom_ops/): every `Status::Code(...)`, `absl::...Error(...)`,
  `throw X(...)`, `fprintf(stderr, ...)` and `print_(...)` (the
  autotuner's stderr), with `+` terms and printf conversions read the same
  way and a local string followed to its initializer; and texts made in one
  place and sent from another: a `return "..."` (a reason a caller puts
  into its message) and a local `std::string x = "..."` that a site sends
  or the function returns.

A message's family is its stable leading words: the first four words of
its first literal run of two words or more, once a common prefix
(`keras_ddl:`, `[keras_ddl]`, `ddlrun:`, ...) is off. Values, names and
numbers (the "…") never enter it, so rewording the end of a message or
adding a field keeps its family; changing its first words makes a new one.
Messages with fewer than two literal words (a bare variable) have no family
and are not collected.

An entry of the page is a `###` heading and its paragraphs up to the next
heading. Its patterns are the back-quoted texts in the heading, and in a
paragraph starting "Messages:" or "Also:" right below it. A family is
covered when some pattern contains its leading words. Every entry says
**Cause.** and **Fix.**, and every pattern of the keras_ddl sections
(all but the last, "MPI, ssh and the network") covers at least one
collected message, so an entry whose message was reworded or removed is
noticed too.
"""

import os
import re

from message_families import HOLE, REPO, all_messages, family

PAGE = os.path.join(REPO, "docs", "troubleshooting.md")
# Its entries are about what MPI, ssh and the system print: no source of
# ours has these messages.
EXTERNAL_SECTION = "## MPI, ssh and the network"


def entries(text):
    """[(heading, patterns, body, external)] of the page."""
    found = []
    external = False
    blocks = re.split(r"^(#{2,3} .*)$", text, flags=re.M)
    for i in range(1, len(blocks), 2):
        heading, body = blocks[i], blocks[i + 1]
        if heading.startswith("## "):
            external = heading.strip() == EXTERNAL_SECTION
            # A section with no ### entries is an entry itself.
            if "**Cause.**" not in body:
                continue
        lists = re.findall(r"^(?:Messages|Also|Symptoms):(.*?)(?:\n\n|\Z)", body, flags=re.M | re.S)
        patterns = [p for source in [heading] + lists for p in code_spans(source)]
        found.append((heading, patterns, body, external))
    return found


def code_spans(text):
    """Back-quoted texts: `x` and ``x with `ticks` ``."""
    return [a or b for a, b in re.findall(r"``\s?(.+?)\s?``|`([^`]+)`", text, flags=re.S)]


def normalized(text):
    return " ".join(text.replace("\\`", "`").split())


def test_the_family_is_the_stable_leading_words():
    assert family("keras_ddl: … must be an int, got … on rank …") == "must be an int"
    assert family("[keras_ddl] stall warning (rank 0): … collective(s)") == "stall warning"
    assert family("keras_ddl: BestModelCheckpoint is not supported; use …") == (
        "BestModelCheckpoint is not supported")
    assert family("…. Every rank must use the same value") == "Every rank must use"
    assert family(f"ddlrun: {HOLE}") is None
    # Values never enter it: two messages that differ only there are one.
    assert family("a collective named '…' is already in flight") == family(
        "a collective named '…' is already in flight…; concurrent collectives need distinct names")


def test_every_message_family_has_an_entry():
    with open(PAGE) as f:
        page = entries(f.read())
    patterns = [normalized(p) for _, ps, _, _ in page for p in ps]
    missing = {}
    for message in all_messages():
        key = family(message.template)
        if key is None:
            continue
        if not any(key in p for p in patterns):
            missing.setdefault(key, []).append(message)
    lines = []
    for key, messages in sorted(missing.items()):
        first = messages[0]
        lines.append(f"  {first.where} ({first.kind}): {first.template}\n"
                     f"    leading words: {key!r}"
                     + "".join(f"\n    also {m.where}" for m in messages[1:]))
    assert not missing, (
        f"docs/troubleshooting.md has no entry for {len(missing)} message famil"
        f"{'y' if len(missing) == 1 else 'ies'}. For each, add to the page's section of that "
        "part of keras_ddl an entry: a heading '### `<the message as the user sees it, with … "
        "for what varies>`' (or a heading naming the family, then a line 'Messages: `...` · "
        "`...`' quoting each message), whose quote contains the leading words shown, then "
        "'**Cause.** ...' and '**Fix.** ...'. Messages without an entry:\n" + "\n".join(lines))


def test_every_entry_says_cause_and_fix_and_covers_a_message():
    with open(PAGE) as f:
        page = entries(f.read())
    assert len(page) >= 40, len(page)
    keys = {family(m.template) for m in all_messages()} - {None}
    problems = []
    for heading, patterns, body, external in page:
        if "**Cause.**" not in body or "**Fix.**" not in body:
            problems.append(f"{heading}: needs **Cause.** and **Fix.**")
        if external:
            continue  # symptoms of MPI, ssh and the system: no source of ours
        if not patterns:
            problems.append(f"{heading}: quotes no message")
        for p in patterns:
            if not any(k in normalized(p) for k in keys):
                problems.append(f"{heading}: `{p}` is no message of keras_ddl's source any "
                                "more (reworded or removed?)")
    assert not problems, "\n".join(problems)


def test_the_checks_would_fail():
    """An uncovered message and a stale pattern are found."""
    text = ("## Part\n\n### `keras_ddl: the engine is out of tea`\n\n**Cause.** c **Fix.** f\n\n"
            "### Group\n\nMessages: `a collective named '…' is already in flight` · "
            "``keras_ddl: `…` must be a number``\n\n**Cause.** c **Fix.** f\n")
    page = entries(text)
    assert [h for h, _, _, _ in page] == ["### `keras_ddl: the engine is out of tea`", "### Group"]
    assert page[1][1] == ["a collective named '…' is already in flight",
                          "keras_ddl: `…` must be a number"]
    covered = [normalized(p) for _, ps, _, _ in page for p in ps]
    assert any(family("a collective named '…' is already in flight…; x") in p for p in covered)
    assert not any(family("keras_ddl: DDL_CYCLE_TIME_MS was left out") in p for p in covered)
