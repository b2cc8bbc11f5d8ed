"""Sphinx pieces of keras_ddl's API reference:

- ``.. ddlrun-flags::`` lists ddlrun's options from its own argparse parser
  (keras_ddl_launcher.ddlrun.build_parser), so the page is what ``ddlrun
  --help`` says;
- ``.. markdown-table:: PATH`` renders the first table of a Markdown page
  of docs/ (the Horovod differences live in docs/horovod.md, once);
- at the end of a build, a warning for every public name of the modules in
  PUBLIC_MODULES (the config value keras_ddl_public_modules) that no page
  documents or that has no docstring (a build with -W then fails);
- Keras-style ```python fences in docstrings become code blocks.
"""

import importlib
import os
import re
import types

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

LOGGER = logging.getLogger(__name__)
# Module -> where its public names are defined (their __module__), for
# modules without __all__.
PUBLIC_MODULES = {
    "keras_ddl": None,
    "keras_ddl.callbacks": None,
    "keras_ddl.optimizers": None,
    "keras_ddl.schedules": "keras_ddl.keras.schedules",
    "keras_ddl.data": "keras_ddl.keras.data",
}


def public_names(module_name, defined_in=None):
    """The public names of a module: its __all__, else its attributes that
    are not private and not modules (for keras_ddl itself, also the names
    it loads on first use), restricted to those defined in `defined_in`
    when given."""
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        return sorted(module.__all__)
    names = set(getattr(module, "_LAZY", {}))
    for name in dir(module):
        value = getattr(module, name)
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        if defined_in is not None and getattr(value, "__module__", None) != defined_in:
            continue
        names.add(name)
    return sorted(names)


class DdlrunFlags(SphinxDirective):
    """ddlrun's options, one ``.. option::`` each, from its parser."""

    def run(self):
        from keras_ddl_launcher.ddlrun import build_parser

        lines = []
        for action in build_parser()._actions:
            if not action.option_strings or action.dest == "help":
                continue
            metavar = "" if action.nargs == 0 else " " + (action.metavar or action.dest.upper())
            names = ", ".join(f"{o}{metavar}" for o in action.option_strings)
            text = (action.help or "").replace("%%", "%")
            text = text[0].upper() + text[1:] if text else text
            text += "" if text.endswith(".") else "."
            if action.required:
                text += " Required."
            elif action.choices:
                text += f" One of {', '.join(map(str, action.choices))}; default {action.default}."
            lines += [f".. option:: {names}", "", f"   {text}", ""]
        return self.parse(lines)

    def parse(self, lines):
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source="ddlrun --help"), self.content_offset,
                                container)
        return container.children


def markdown_inline(text):
    """Markdown inline markup as reStructuredText: code, links, bold."""
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", text)          # [text](url) -> text
    parts = re.split(r"(`[^`]+`)", text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # code: an inline literal, which must not touch a word
            before, after = parts[i - 1], parts[i + 1] if i + 1 < len(parts) else ""
            out.append(("\\ " if before[-1:].isalnum() else "") + f"``{part[1:-1]}``"
                       + ("\\ " if after[:1].isalnum() else ""))
        else:
            out.append(part.replace("*", "\\*").replace("\\*\\*", "**"))
    return "".join(out)


class MarkdownTable(SphinxDirective):
    """The first table of a Markdown file, as a list-table."""

    required_arguments = 1

    def run(self):
        path = os.path.normpath(os.path.join(os.path.dirname(self.env.doc2path(self.env.docname)),
                                             self.arguments[0]))
        self.env.note_dependency(path)
        with open(path) as f:
            rows = [line.strip() for line in f if line.strip().startswith("|")]
        cells = [[c.strip() for c in row.strip("|").split(" | ")] for row in rows
                 if not re.fullmatch(r"\|[-| :]+\|", row)]
        width = len(cells[0])
        lines = [".. list-table::", "   :header-rows: 1", ""]
        for row in cells:
            row = (row + [""] * width)[:width]
            lines.append(f"   * - {markdown_inline(row[0])}")
            lines += [f"     - {markdown_inline(cell)}" for cell in row[1:]]
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source=path), self.content_offset, container)
        return container.children


def fenced_code_as_rst(app, what, name, obj, options, lines):
    """Keras-style docstrings fence code in Markdown (```python ... ```);
    as reStructuredText that is a code-block directive. Edits `lines` in
    place, as autodoc expects."""
    out, fence = [], None
    for line in lines:
        stripped = line.strip()
        if fence is None and stripped.startswith("```"):
            fence = line[:len(line) - len(line.lstrip())]
            out += [f"{fence}.. code-block:: {stripped[3:].strip() or 'text'}", ""]
        elif fence is not None and stripped == "```":
            fence = None
            out.append("")
        elif fence is not None:
            out.append(f"{fence}   {line[len(fence):]}" if line.strip() else "")
        else:
            out.append(line)
    if fence is not None:
        LOGGER.warning(f"{name}: a ``` code fence is not closed")
    lines[:] = out


def check_public_names(app, env):
    """A warning for each public name no page documents, or that has no
    docstring of its own."""
    documented = set(env.get_domain("py").objects)
    for module, defined_in in app.config.keras_ddl_public_modules.items():
        for name in public_names(module, defined_in):
            if f"{module}.{name}" not in documented:
                LOGGER.warning(f"the API reference does not document {module}.{name}")
            value = getattr(importlib.import_module(module), name)
            if callable(value) and not (getattr(value, "__doc__", None) or "").strip():
                LOGGER.warning(f"{module}.{name} has no docstring")


def setup(app):
    app.add_config_value("keras_ddl_public_modules", PUBLIC_MODULES, "env")
    app.add_directive("ddlrun-flags", DdlrunFlags)
    app.add_directive("markdown-table", MarkdownTable)
    app.connect("autodoc-process-docstring", fenced_code_as_rst)
    app.connect("env-check-consistency", check_public_names)
    return {"parallel_read_safe": True, "version": "1"}

