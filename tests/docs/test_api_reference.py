"""The API reference (docs/api/, Sphinx with autodoc and napoleon) builds
with warnings as errors: a docstring that docutils cannot read, a public
name of keras_ddl, keras_ddl.callbacks, .optimizers, .schedules or .data
that no page documents or that has no docstring, or a ddlrun option
without help fails the build, and so this test. Offline: no intersphinx,
no theme package beyond Sphinx's own."""

import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(REPO, "docs", "api")


def sphinx(source, out, env=None):
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-E",
                           "-b", "html", source, str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **(env or {})))


def test_the_reference_builds_without_a_warning(tmp_path):
    proc = sphinx(SOURCE, tmp_path / "html")
    assert proc.returncode == 0, proc.stderr[-6000:]
    pages = sorted(os.listdir(tmp_path / "html"))
    for page in ("keras_ddl.html", "callbacks.html", "optimizers.html", "schedules.html",
                 "data.html", "horovod.html", "ddlrun.html"):
        assert page in pages, pages
    with open(tmp_path / "html" / "ddlrun.html") as f:
        ddlrun = f.read()
    assert "--max-restarts" in ddlrun and "--hostfile" in ddlrun, ddlrun[:2000]
    with open(tmp_path / "html" / "horovod.html") as f:
        horovod = f.read()
    assert "What a script changes" in horovod and "elastic" in horovod


def test_a_broken_docstring_or_an_undocumented_name_fails_the_build(tmp_path):
    """The same configuration on a small module: an unreadable docstring
    and a public function no page documents are both errors."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "sample_api.py").write_text(textwrap.dedent('''
        """A module."""


        def documented(x):
            """Does something with ``x, a literal never closed.

            A paragraph
                indented past its first line.
            """


        def forgotten():
            """Never on a page."""
        '''))
    (project / "conf.py").write_text(textwrap.dedent(f'''
        import sys
        sys.path[:0] = [{str(project)!r}, {os.path.join(SOURCE, "_ext")!r}]
        extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "keras_ddl_reference"]
        keras_ddl_public_modules = {{"sample_api": None}}
        '''))
    (project / "index.rst").write_text("Sample\n======\n\n.. autofunction:: sample_api.documented\n")
    proc = sphinx(str(project), tmp_path / "html")
    assert proc.returncode != 0
    assert "docstring of sample_api.documented" in proc.stderr, proc.stderr
    assert "does not document sample_api.forgotten" in proc.stderr, proc.stderr
