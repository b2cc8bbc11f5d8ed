"""The documentation's figures and links: fast, no TensorFlow, no mpiexec.

- Every docs/results/*.json has the fields a reader needs to trust and redo it.
- Every results block in README.md and docs/PERFORMANCE.md is what
  ``python -m keras_ddl_tools.render_docs`` makes from the committed files.
- The README quotes no performance figure outside those blocks.
- Every relative link in README.md and docs/ points at a file that exists
  (or one of PENDING, pages other branches are adding), and every #anchor
  into a Markdown file at one of its headings.
- The docs stand alone: back-ticked paths exist, no page or README reads
  as a work log, nothing names a file outside the repository, a figure in
  prose near a results file is one the file holds, and the settings table
  (custom_ops/common/settings.def) and ddlrun's forwarded prefixes are all
  documented, and the settings guide and reference (settings.md, knobs.md)
  name only variables the code reads and ddlrun options that exist. (Notes in docs/performance-notes/ are dated history and keep
  their words.)
"""

import glob
import os
import re
import subprocess
import sys

import pytest

from keras_ddl_tools import render_docs, results

# The repository this test file is in (keras_ddl_tools may be imported from
# an installed copy, whose directory holds no docs).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "docs", "results")
# Pages linked from the docs that other branches are writing; remove a name
# from this list once its file exists on the main branch.
PENDING = set()  # pages another branch creates, while it has not landed


def _read(rel):
    with open(os.path.join(REPO, rel)) as f:
        return f.read()


def _markdown_files():
    files = ["README.md"] + sorted(
        os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "**", "*.md"),
                                                    recursive=True))
    return files


def test_results_files_are_complete():
    all_results = results.load_all(RESULTS)
    assert all_results, "docs/results/ holds no results file"
    for name, data in all_results.items():
        assert data.get("name") == name, f"{name}.json names itself '{data.get('name')}'"
        assert results.check(data) == [], f"docs/results/{name}.json: {results.check(data)}"
        for table, rows in data["tables"].items():
            for row in rows:
                for field, value in row.items():
                    if isinstance(value, dict) and "median" in value:
                        assert value["min"] <= value["median"] <= value["max"], (name, table,
                                                                                 field)
                        assert len(value["values"]) == len(data["launches"])


@pytest.mark.parametrize("rel", render_docs.DOCS)
def test_rendered_blocks_match_results(rel):
    text = _read(rel)
    views = render_docs.blocks(text)
    for view in views:
        assert view in render_docs.VIEWS, f"{rel}: unknown results view '{view}'"
    rendered = render_docs.render_text(text, results.load_all(RESULTS))
    assert rendered == text, (f"{rel}: a results block differs from docs/results/ "
                              f"(run python -m keras_ddl_tools.render_docs)")


def test_every_results_block_is_closed():
    for rel in render_docs.DOCS:
        text = _read(rel)
        opened = re.findall(r"<!-- results:([\w.\-]+) -->", text)
        closed = re.findall(r"<!-- /results:([\w.\-]+) -->", text)
        assert opened == closed, f"{rel}: unmatched results markers {opened} vs {closed}"
        assert opened == render_docs.blocks(text)


def test_render_check_mode_agrees():
    proc = subprocess.run([sys.executable, "-m", "keras_ddl_tools.render_docs", "--check"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _outside_blocks_and_code(text):
    text = re.sub(r"<!-- results:(?P<v>[\w.\-]+) -->.*?<!-- /results:(?P=v) -->", "", text,
                  flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`]*`", "", text)


FIGURE = re.compile(r"\d+(\.\d+)?\s?(x\b|%|ms\b|us\b|GB/s|MB/s|Gbit/s|images/s)")


def test_readme_quotes_no_figure_outside_rendered_blocks():
    prose = _outside_blocks_and_code(_read("README.md"))
    found = [m.group(0) for m in FIGURE.finditer(prose)]
    assert not found, f"README prose quotes figures not rendered from docs/results/: {found}"


def test_readme_keeps_the_ci_commands():
    text = _read("README.md")
    install = [line for line in text.splitlines() if line.endswith("# (1) install")]
    test = [line for line in text.splitlines() if line.endswith("# (2) test")]
    assert install and install[0].startswith(
        "pip install -r requirements.txt && pip install --no-build-isolation .")
    assert test and test[0].startswith("pytest -q tests")
    assert text.index("# (1) install") < text.index("## Quickstart"), "install before quickstart"


def test_readme_is_short():
    assert len(_read("README.md").splitlines()) <= 230


def _anchors(rel):
    """GitHub-style anchors of a Markdown file's headings."""
    out = set()
    in_code = False
    for line in _read(rel).splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        title = re.sub(r"[^\w\- ]", "", title)
        out.add(title.replace(" ", "-"))
    return out


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("rel", _markdown_files())
def test_relative_links_resolve(rel):
    text = re.sub(r"```.*?```", "", _read(rel), flags=re.S)
    base = os.path.dirname(rel)
    bad = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):   # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(base, path)) if path else rel
        if dest in PENDING:
            continue
        if not os.path.exists(os.path.join(REPO, dest)):
            bad.append(target)
        elif anchor and dest.endswith(".md") and anchor not in _anchors(dest):
            bad.append(target + " (no such heading)")
    assert not bad, f"{rel}: broken relative links {bad}"


def test_lab_notes_are_dated_history():
    for path in glob.glob(os.path.join(REPO, "docs", "performance-notes", "*.md")) + \
            [os.path.join(REPO, "docs", "PERFORMANCE.md")]:
        with open(path) as f:
            text = f.read()
        rel = os.path.relpath(path, REPO)
        assert not re.search(r"\b(today|tonight)\b", text, re.I), f"{rel} says today/tonight"
        assert "../shared/" not in text and "steering repo" not in text, rel


def test_merge_gives_median_and_range():
    def launch(speedup, day):
        return {"meta": {"date": f"2026-01-0{day}T00:00:00Z", "commit": "abc", "command": "c",
                         "machine": {"cores": 2}},
                "allreduce": [{"size": "4KB", "speedup": speedup, "wrong": 0}]}
    merged = results.merge([launch(1.0, 1), launch(3.0, 2), launch(2.0, 3)], "t",
                           "mpiexec -n 2 python -m keras_ddl.bench allreduce", "test")
    row = merged["tables"]["allreduce"][0]
    assert row["key"] == "4KB"
    assert row["speedup"]["median"] == 2.0
    assert (row["speedup"]["min"], row["speedup"]["max"]) == (1.0, 3.0)
    assert merged["benchmark"] == "allreduce"
    assert merged["dates"] == ["2026-01-01T00:00:00Z", "2026-01-03T00:00:00Z"]
    assert results.check(merged) == []


def _fake_launch(payload, day):
    meta = {"date": f"2026-01-0{day}T10:00:00Z", "commit": "f" * 40, "command": "c",
            "machine": {"cores": 2, "cpu": "test", "kernel": "Linux"}}
    return {"meta": meta, **payload}


def test_views_for_future_results_files_render():
    """The views waiting for cluster and scaling results files work on the
    JSON those benchmarks write (shapes copied from keras_ddl/bench)."""
    cluster = [_fake_launch({
        "nodes": 2, "ranks_per_node": 1, "rate": "1gbit", "burst_bytes": 262144,
        "rows": [{"size": "64MB", "bound_us": 5e5, "auto_us": 5.4e5 + 1000 * d,
                  "hierarchical_us": 6e5, "flat_us": 6e5, "auto/mpi": 1.4, "hierarchical/mpi": 1.2, "flat/mpi": 1.2,
                  "mpi_us": 8e5, "fp16_us": 2.8e5, "fp16_speedup": 1.9,
                  "auto_of_bound": 0.92, "best/auto": 0.9, "wrong": 0}],
        "raw": {"auto": [[{"time_us": 1.0}]]}}, d) for d in (1, 2, 3)]
    scaling = [_fake_launch({
        "scaling": {"model": "cnn 32px 66k params", "ranks": 2, "batch_per_rank": 32,
                    "1rank_ms": 50.0, "2rank_ms": 52.0 + d, "efficiency": 0.95,
                    "machine": 0.97, "communication": 0.98, "identical": "yes"},
        "step_s": {"1": [0.05], "2": [0.052], "independent": [0.051]}}, d) for d in (1, 2)]
    fit_cluster = [_fake_launch({
        "rows": [{"overlap": "on", "wire": "fp16", "1rank_ms": 900.0, "2x1_ms": 1000.0,
                  "efficiency": 0.9, "2x1_indep_ms": 950.0, "machine": 0.95,
                  "communication": 0.95, "identical": "yes"}],
        "step_s": {}, "timeline": []}, 1)]
    all_results = {
        "cluster_2x1_1gbit": results.merge(cluster, "cluster_2x1_1gbit", "c", "test"),
        "fit_scaling_2": results.merge(scaling, "fit_scaling_2", "c", "test"),
        "fit_cluster_2x1_1gbit": results.merge(fit_cluster, "fit_cluster_2x1_1gbit", "c", "t"),
    }
    text = render_docs.render_view("cluster_2x1_1gbit.allreduce", all_results)
    assert "| 64MB | 500.00 | 800.00 (800.00-800.00) | 542.00 (541.00-543.00) |" in text
    assert "92% (92%-92%)" in text and "2 nodes x 1 rank(s)" in text
    text = render_docs.render_view("fit_scaling_2.scaling", all_results)
    assert "| cnn 32px 66k params | 50.0 (50.0-50.0) | 53.5 (53.0-54.0) |" in text
    text = render_docs.render_view("fit_cluster_2x1_1gbit.fit", all_results)
    assert "| on/fp16 | 0.900 (0.900-0.900) |" in text
    with pytest.raises(KeyError):
        render_docs.render_view("no_such.view", all_results)


# --- Docs that stand alone ------------------------------------------------------------------
#
# Each check below was run against the repository at commit a26b009 (before
# the pages were rewritten) and failed there; its docstring says on what.


def _tracked(pattern):
    """Files of the repository matching a glob, as paths relative to it
    (git's index when there is one, so caches and build output are left out)."""
    proc = subprocess.run(["git", "-C", REPO, "ls-files", "--", pattern], capture_output=True,
                          text=True)
    if proc.returncode == 0 and proc.stdout.strip():
        return sorted(proc.stdout.split())
    return sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, pattern),
                                                                 recursive=True))


def _pages():
    """Every Markdown page a reader meets: docs/, the READMEs, custom_ops'
    READMEs; the dated lab notes of docs/performance-notes/ are history and
    keep their words."""
    return [p for p in _tracked("*.md") if not p.startswith("docs/performance-notes/")]


def _prose(text):
    """text without fenced code and without rendered results blocks (those
    are checked against their files above)."""
    text = re.sub(r"<!-- results:(?P<v>[\w.\-]+) -->.*?<!-- /results:(?P=v) -->", "", text,
                  flags=re.S)
    return re.sub(r"^ *```.*?^ *```", "", text, flags=re.S | re.M)


def _expand_braces(token):
    """'a.{h,cc}' -> ['a.h', 'a.cc'] (nested braces too)."""
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    return [t for alt in m.group(1).split(",")
            for t in _expand_braces(token[:m.start()] + alt + token[m.end():])]


_TOP = {d for d in os.listdir(REPO) if not d.startswith(".")}
_FILE_EXT = re.compile(r"\.(py|md|cc|h|json|def|png|txt|sh|toml|cfg|ya?ml|csv)$")
# A path in another project's tree, named as such ("Horovod's `examples/...`").
_OTHER_PROJECT = re.compile(r"(Horovod|Gloo|TensorFlow|Keras|NCCL|MPICH|Open MPI)('s|')\s*$")


def _backticked_paths(text):
    """(token, candidates) for every back-ticked token of the prose that is
    a path into the repository: no spaces, not absolute (`/dev/shm`, `~/x`,
    `$VAR/x` are the user's machine), containing a '/', and either naming a
    file by its extension, ending in '/', or starting at a top-level entry of
    the repository. Upper-case placeholders (`NAME.json`) and globs match any
    file; `{a,b}` expands."""
    for m in re.finditer(r"`([^`\n]+)`", text):
        token = m.group(1).strip()
        if (" " in token or "/" not in token or token.startswith(("/", "~", "$", "-"))
                or "://" in token or "=" in token
                or _OTHER_PROJECT.search(text[max(0, m.start() - 20):m.start()])):
            continue
        token = re.sub(r"::[\w\[\]-]+$|:\d+(-\d+)?$", "", token)   # test ids, line numbers
        first = token.split("/")[0]
        if re.fullmatch(r"[\w.-]+/", token) and first not in _TOP:
            continue    # a folder's own name (`common/`), not a path
        if not (_FILE_EXT.search(token) or token.endswith("/") or first in _TOP
                or first in (".", "..")):
            continue
        if "*" in token:    # a pattern: its folder must exist, files may not yet
            token = os.path.dirname(token) + "/"
        pattern = re.sub(r"\b[A-Z][A-Z0-9_]{2,}\b", "*", token)
        yield token, _expand_braces(pattern)


def _build_products():
    """Paths (from the repository root) of the files the build writes into
    the package: setup.py names each output it records, and a clean checkout
    has none of them."""
    with open(os.path.join(REPO, "setup.py")) as f:
        names = set(re.findall(r'"([\w.]+\.(?:json|so|def))"', f.read()))
    return {f"src/keras_ddl/{n}" for n in names}


@pytest.mark.parametrize("rel", _pages())
def test_backticked_paths_exist(rel):
    """A path written in back-ticks names a file or folder of the repository,
    relative to its root or to the page's folder. Failed on a26b009 on
    knobs.md's `custom_ops/engine/config.cc` and `.h`, architecture.md's
    `engine/executor.cc` and `common/traffic.h`, the common/ README's
    `types.h/.cc` and scaling_model.md's `scaling_model/systems.py`."""
    base = os.path.dirname(rel)
    built = _build_products()
    bad = [token for token, candidates in _backticked_paths(_prose(_read(rel)))
           if token not in built and not all(glob.glob(os.path.join(REPO, b, c)) or glob.glob(os.path.join(REPO, c))
                      for c in candidates for b in (base,))]
    assert not bad, f"{rel}: back-ticked paths that do not exist: {bad}"


# Words of a work log: what a person did on a day, not what the software does.
WORK_LOG = [
    (re.compile(r"\btoday\b(?!'s)|\btonight\b", re.I), "today/tonight"),
    (re.compile(r"\bthis stop\b", re.I), "this stop"),
    (re.compile(r"\bissue #\d+", re.I), "issue #N"),
    (re.compile(r"\bscratch build", re.I), "scratch build"),
    (re.compile(r"\bfor the lead\b|\bnot for the docs\b", re.I), "a note to colleagues"),
    (re.compile(r"(?<![\w`'])I(?! */ *O)(?=[ ,](?!\.))(?![^`\n]*`[^`\n]*$)"), '"I" as the writer'),
    (re.compile(r"(?<![\w/.`-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/.-])"),
     "a commit hash"),
]


@pytest.mark.parametrize("rel", _pages())
def test_no_work_log_words(rel):
    """User pages and READMEs describe the software in the present tense;
    what happened when, and who did it, goes to a dated note in
    docs/performance-notes/. Failed on a26b009 on PERFORMANCE.md's "scratch
    build" and commit hashes in prose; topology.md's "issue #27", "scratch
    build", "for the lead to re-measure" and "not for the docs' tables";
    scaling_model.md's "I could not retrieve", "Today that is", "Issue #27"
    and "main's 0446f4a"; custom_ops/README.md's "today over MPI"."""
    prose = re.sub(r"`[^`\n]*`", "``", _prose(_read(rel)))
    found = [f"{label}: ...{prose[max(0, m.start() - 30):m.end() + 30]!r}..."
             for pattern, label in WORK_LOG for m in pattern.finditer(prose)]
    assert not found, f"{rel}: words of a work log: {found}"


def _outside_references(text, prose):
    """References to files outside the repository: the project's private
    design notes, the directories beside the checkout, and (in prose, not in
    a command) scratch paths."""
    found = re.findall(r"\b(?:DESIGN|BENCHMARKS)\.md\b|\.\./shared\b|/work/[\w.-]*|shared/anchors",
                       text)
    found += re.findall(r"(?<![\w.])/tmp/[\w./-]*", re.sub(r"`[^`\n]*`", "", prose))
    return found


def test_nothing_refers_to_a_file_outside_the_repository():
    """No page, README, source file or test names a file the repository does
    not hold (DESIGN.md, BENCHMARKS.md, ../shared, /work/...); no page's prose
    points at a /tmp path (a command may write there). Failed on a26b009 on
    failures.md's and gpus.md's DESIGN.md, scaling_model.md's BENCHMARKS.md,
    both pages' /work/shared/anchors path, and code citing DESIGN.md,
    BENCHMARKS.md or /work/shared (restart.py, test_lars.py, bench,
    scaling_model)."""
    this = os.path.relpath(os.path.abspath(__file__), REPO)
    bad = {}
    for rel in _tracked("*"):
        if (rel == this
                or not re.search(r"\.(md|py|cc|h|def|txt|cfg|toml|sh|json)$", rel)):
            continue
        text = _read(rel)
        found = _outside_references(text, _prose(text) if rel.endswith(".md") else "")
        if found:
            bad[rel] = sorted(set(found))
    assert not bad, f"references to files outside the repository: {bad}"


# A figure in prose: a ratio (1.96x), a percentage, a time, a share written
# as 0.xx. Sizes, rates and counts are not figures.
FIGURE_IN_PROSE = re.compile(
    r"(?<![\w.])(\d+(?:\.\d+)?)(?:\s*-\s*(\d+(?:\.\d+)?))?(?:x\b|%|\s?(?:ms|us|s)\b)"
    r"|(?<![\w.])(\d+\.\d+)\s*-\s*(\d+\.\d+)(?![\w.])"
    r"|(?<![\w.])(0\.\d{2,})(?![\w.])")


def _units(v):
    """A file's number in the units prose uses: as is, as a percentage, us
    as ms and s, and inverted (0.53x the time is 1.89x as fast)."""
    return [v, 100 * v, v / 1e3, v / 1e6] + ([1 / v] if v else [])


def _file_values(result):
    """(numbers, ranges) of a results file's tables: every number (medians,
    ends of ranges, per-launch values) in _units, and per field the
    (lowest, highest) pair in the same units, for quoted ranges."""
    numbers, ranges = [], []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("min"), (int, float)):
                lows, highs = _units(node["min"]), _units(node["max"])
                ranges.extend(zip(lows, highs))
                ranges.extend(zip(highs[4:], lows[4:]))    # inverted, the ends swap
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            numbers.extend(_units(node))
    walk(result["tables"])
    return numbers, ranges


def _same(quoted, value):
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    return abs(round(value, decimals) - float(quoted)) < 1e-9


def _matches(low, high, values):
    """A quoted figure is one of the file's numbers; a quoted range
    low-high is one field's lowest and highest launch."""
    numbers, ranges = values
    if high is None:
        return any(_same(low, v) for v in numbers)
    return any(_same(low, a) and _same(high, b) for a, b in ranges)


def _paragraphs_with_files(text, names):
    """(paragraph, [results names]) for each paragraph of prose that names a
    results file (docs/results/NAME.json, NAME.json or NAME in back-ticks) or
    follows a rendered results block, up to the next heading or block."""
    current = []
    text = re.sub(r"^ *```.*?^ *```", "", text, flags=re.S | re.M)
    for part in re.split(r"(<!-- results:[\w.\-]+ -->.*?<!-- /results:[\w.\-]+ -->|^#+ [^\n]*)",
                         text, flags=re.S | re.M):
        block = re.match(r"<!-- results:([\w\-]+)\.", part)
        if block:
            current = [block.group(1)] if block.group(1) in names else []
            continue
        if part.startswith("#"):
            current = []
            continue
        for para in re.split(r"\n\s*\n", part):
            named = [n for n in names if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", para)]
            if named or current:
                yield para, named or current


@pytest.mark.parametrize("rel", _pages())
def test_figures_in_prose_match_their_results_file(rel):
    """A paragraph that names a results file, or follows a table rendered
    from one, quotes only figures the file holds (a median, a launch's value
    or an end of a range, to the digits quoted; as a percentage, in ms or s,
    or inverted). A figure that comes from elsewhere belongs in a paragraph
    that does not name the file, with its own source. Failed on a26b009 on
    PERFORMANCE.md's "1.86-2.05" (the file gives 1.86-2.04), its 7.8 s bound
    and 0.84 share (97.6 MB is MiB: 8.19 s and 0.88) and its piece-size
    figures of an experimental build, and on scaling_model.md's figures
    beside `racks_2x4x1_4to1` that the file does not hold."""
    all_results = results.load_all(RESULTS)
    values = {name: _file_values(r) for name, r in all_results.items()}
    bad = []
    for para, named in _paragraphs_with_files(_read(rel), sorted(all_results)):
        pool = ([v for n in named for v in values[n][0]],
                [r for n in named for r in values[n][1]])
        prose = re.sub(r"`[^`\n]*`", "", para)
        for m in FIGURE_IN_PROSE.finditer(prose):
            low, high = ((m.group(1), m.group(2)) if m.group(1) else
                         (m.group(3), m.group(4)) if m.group(3) else (m.group(5), None))
            if not _matches(low, high, pool):
                bad.append(f"{m.group(0)!r} ({', '.join(named)})")
    assert not bad, f"{rel}: figures that match no number of the results file named: {bad}"


def _settings_rows():
    """(variable, scope) of every row of custom_ops/common/settings.def."""
    rows = re.findall(r"^DDL_(?:NUMBER|WHOLE|CHOICE|TEXT)\((DDL_\w+),.*,\s*(SHARED|PER_RANK)\)\s*$",
                      _read("custom_ops/common/settings.def"), re.M)
    assert len(rows) >= 15, rows
    return rows


def test_every_setting_is_documented_with_its_scope():
    """knobs.md has a row for every setting of settings.def; settings.md
    lists every SHARED one in its table of compared settings and names every
    PER_RANK one among those not compared. Failed on a26b009: settings.md
    listed DDL_AUTOTUNE_CYCLES neither way."""
    knobs, settings = _read("docs/knobs.md"), _read("docs/settings.md")
    compared = re.findall(r"^\| `(DDL_\w+)` +\|", settings, re.M)
    not_compared = settings[settings.index("Not compared"):]
    missing = []
    for var, scope in _settings_rows():
        if not re.search(rf"^\| `{var}` \|", knobs, re.M):
            missing.append(f"knobs.md has no row for {var}")
        if scope == "SHARED" and var not in compared:
            missing.append(f"settings.md does not list {var} as compared")
        if scope == "PER_RANK" and (var in compared or f"`{var}`" not in not_compared):
            missing.append(f"settings.md does not name {var} among the settings not compared")
    assert not missing, missing


def _read_by_the_code(name):
    """Whether the core, the Python packages or setup.py read ``name`` (a
    quoted string there, or a row of settings.def)."""
    if name in {var for var, _ in _settings_rows()}:
        return True
    sources = [os.path.join(REPO, "setup.py")]
    for top in ("src", "custom_ops"):
        for ext in ("py", "cc", "h"):
            sources += glob.glob(os.path.join(REPO, top, "**", f"*.{ext}"), recursive=True)
    for path in sources:
        with open(path, errors="replace") as f:
            if f'"{name}"' in f.read():
                return True
    return False


def test_the_settings_guide_names_only_settings_and_options_that_exist():
    """Every DDL_* variable settings.md and knobs.md name is read by the
    code, and every option of a `ddlrun ...` they quote is ddlrun's."""
    sys.path.insert(0, os.path.join(REPO, "src"))
    try:
        from keras_ddl_launcher.ddlrun import build_parser
    finally:
        sys.path.pop(0)
    options = {o for a in build_parser()._actions for o in a.option_strings}
    options |= {"--no-prefix-output"}  # BooleanOptionalAction's negative form
    unknown = []
    for rel in ("docs/settings.md", "docs/knobs.md"):
        page = _read(rel)
        names = set(re.findall(r"\bDDL_[A-Z0-9_]*[A-Z0-9]\b", page))
        assert len(names) >= 15, (rel, names)
        unknown += [f"{rel}: {n}" for n in sorted(names) if not _read_by_the_code(n)]
        quoted = re.findall(r"`ddlrun ([^`]*)`", page)
        assert quoted, rel
        for words in quoted:
            unknown += [f"{rel}: ddlrun {w}" for w in words.replace("/", " ").split()
                        if w.startswith("-") and w.split("=")[0] not in options]
    assert not unknown, unknown


def test_multinode_names_every_prefix_ddlrun_forwards():
    """multinode.md's list of the variables ddlrun exports under Open MPI is
    ddlrun's own. Failed on a26b009: the page left out HOROVOD_."""
    import ast
    tree = ast.parse(_read("src/keras_ddl_launcher/ddlrun.py"))
    prefixes = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                    if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", None) == "OPENMPI_EXPORT_PREFIXES"
                            for t in node.targets))
    page = _read("docs/multinode.md")
    missing = [p for p in prefixes if f"`{p}`" not in page and f"`{p}*`" not in page]
    assert not missing, f"docs/multinode.md does not name {missing}"


def test_the_porting_guides_launcher_table_maps_to_ddlrun():
    """docs/horovod_porting.md's table of horovodrun's options: a row for
    each of the launch options users carry over, and every ddlrun option or
    DDL_* variable it gives in their place exists."""
    sys.path.insert(0, os.path.join(REPO, "src"))
    try:
        from keras_ddl_launcher.ddlrun import build_parser
    finally:
        sys.path.pop(0)
    options = {o for a in build_parser()._actions for o in a.option_strings}
    page = _read("docs/horovod_porting.md")
    table = page[page.index("| horovodrun | ddlrun | note |"):]
    rows = re.findall(r"^\| (`.*?) \| (.*?) \|", table.split("\n\n")[0], re.M)
    horovodrun = " ".join(left for left, _ in rows)
    missing = [o for o in ("--hostfile", "--network-interface", "--timeline-filename",
                           "--autotune", "-np", "-H") if f"`{o}" not in horovodrun]
    unknown = []
    for left, right in rows:
        for code in re.findall(r"`([^`]*)`", right):
            for word in code.split():
                if word.startswith("-") and word.split("=")[0] not in options:
                    unknown.append(f"{left}: ddlrun has no {word}")
                name = re.match(r"(DDL_[A-Z0-9_]*[A-Z0-9])", word)
                if name and not _read_by_the_code(name.group(1)):
                    unknown.append(f"{left}: nothing reads {name.group(1)}")
    assert len(rows) >= 10 and not missing and not unknown, (len(rows), missing, unknown)
