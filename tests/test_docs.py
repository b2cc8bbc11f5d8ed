"""The documentation's figures and links: fast, no TensorFlow, no mpiexec.

- Every docs/results/*.json has the fields a reader needs to trust and redo it.
- Every results block in README.md and docs/PERFORMANCE.md is what
  ``python -m keras_ddl_tools.render_docs`` makes from the committed files.
- The README quotes no performance figure outside those blocks.
- Every relative link in README.md and docs/ points at a file that exists
  (or one of PENDING, pages other branches are adding), and every #anchor
  into a Markdown file at one of its headings.
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
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
