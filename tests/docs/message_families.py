"""The messages keras_ddl prints or raises, collected from its source, for
tests/docs/test_troubleshooting.py (which explains the rules).

A message is collected as a *template*: its literal text with "…" for
every part computed at run time (a variable, a call, an f-string field, a
printf conversion). Its family is its leading words: an entry of
docs/troubleshooting.md whose pattern matches the template's start covers
it, and every message with the same start is covered by the same entry.
"""

import ast
import functools
import os
import re
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The runtime (its Python package with ddlrun and the Horovod front door,
# and the C++ core) and the test cluster's runner, which the README tells
# users to try. The other tools (benchmarks, scaling model) are not.
PYTHON_DIRS = ("src/keras_ddl", "src/keras_ddl_launcher", "src/keras_ddl_tools/cluster")
CPP_DIRS = ("custom_ops",)
HOLE = "…"
WORD = re.compile(r"[A-Za-z][A-Za-z_'-]*[A-Za-z]")
# Words every message may start with, which do not tell families apart.
PREFIXES = ("[keras_ddl] warning:", "[keras_ddl]", "keras_ddl: warning:", "keras_ddl:",
            "keras_ddl.horovod:", "keras_ddl.data:", "ddlrun:")


@dataclass
class Message:
    where: str      # path:line
    kind: str       # how it reaches the user: "raise ValueError", "warning", "stderr", ...
    template: str   # literal text, HOLE for what varies

    def literal_words(self):
        return len(WORD.findall(strip_prefix(self.template)))


def strip_prefix(text):
    text = text.strip()
    for prefix in PREFIXES:
        if text.startswith(prefix):
            return text[len(prefix):].strip()
    return text


def tidy(text):
    """One line, single spaces, runs of holes made one."""
    text = re.sub(r"\s+", " ", text)
    text = re.sub(rf"{HOLE}(\s*{HOLE})+", HOLE, text)
    return text.strip()


# ---------------------------------------------------------------- Python

# Calls whose first argument (or `file=sys.stderr` print) is a message.
WARN_CALLS = {"warn", "warning"}


class _PythonCollector(ast.NodeVisitor):
    def __init__(self, path, helpers):
        self.path = path
        self.helpers = helpers   # {function name: parameter index}: messages passed on
        self.found = []
        self.scopes = [None]     # enclosing function nodes
        self.new_helpers = {}

    def visit_FunctionDef(self, node):
        self.scopes.append(node)
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Raise(self, node):
        exc = node.exc
        if isinstance(exc, ast.Call) and exc.args:
            name = _call_name(exc.func)
            # OSError(errno, text): the text is the message.
            arg = exc.args[1] if name == "OSError" and len(exc.args) > 1 else exc.args[0]
            self._add(arg, f"raise {name}", node)
        self.generic_visit(node)

    def visit_Call(self, node):
        name = _call_name(node.func)
        dotted = _dotted(node.func)
        if name in WARN_CALLS and dotted.startswith(("warnings.", "_warnings.")) and node.args:
            self._add(node.args[0], "warning", node)
        elif dotted in ("sys.stderr.write",) and node.args:
            self._add(node.args[0], "stderr", node)
        elif name == "print" and any(k.arg == "file" and _dotted(k.value) == "sys.stderr"
                                     for k in node.keywords) and node.args:
            self._add(node.args[0], "stderr", node)
        elif name == "error" and dotted.endswith(("parser.error", "p.error")) and node.args:
            self._add(node.args[0], "usage error", node)
        elif name in self.helpers:
            index = self.helpers[name]
            if len(node.args) > index:
                self._add(node.args[index], f"message passed to {name}()", node)
        self.generic_visit(node)

    def _add(self, expr, kind, node):
        scope = self.scopes[-1]
        template = tidy(_render(expr, scope, node.lineno, depth=2))
        where = f"{self.path}:{node.lineno}"
        found = Message(where, kind, template)
        if found.literal_words() >= 2:
            self.found.append(found)
            return
        # A message that comes in as a parameter: its callers give it.
        if scope is not None and isinstance(expr, (ast.Name, ast.JoinedStr, ast.BinOp)):
            params = [a.arg for a in scope.args.args]
            used = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
            for i, p in enumerate(params):
                if p in used and p not in ("self", "cls"):
                    self.new_helpers[scope.name] = i - (1 if params[0] in ("self", "cls") else 0)
                    return


def _call_name(func):
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _assigned(scope, name, before):
    """The value last assigned to `name` in `scope` before line `before`."""
    value = None
    for node in ast.walk(scope) if scope is not None else ():
        if isinstance(node, ast.Assign) and node.lineno < before:
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == name:
                    if value is None or node.lineno > value.lineno:
                        value = node
    return value.value if value is not None else None


def _render(expr, scope, line, depth):
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    if isinstance(expr, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in expr.values)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return _render(expr.left, scope, line, depth) + _render(expr.right, scope, line, depth)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod):  # "..." % args
        return re.sub(r"%[-#0 +]*\d*(\.\d+)?[sdfrgx]", HOLE,
                      _render(expr.left, scope, line, depth))
    if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
            and expr.func.attr == "format"):
        return re.sub(r"\{[^}]*\}", HOLE, _render(expr.func.value, scope, line, depth))
    if isinstance(expr, ast.Name) and depth > 0:
        value = _assigned(scope, expr.id, line)
        if value is not None:
            return _render(value, scope, line, depth - 1)
    return HOLE


def python_messages():
    files = []
    for folder in PYTHON_DIRS:
        for root, _, names in os.walk(os.path.join(REPO, folder)):
            files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".py")]
    trees = {}
    for path in sorted(files):
        with open(path) as f:
            trees[os.path.relpath(path, REPO)] = ast.parse(f.read(), path)
    helpers, found = {}, []
    # Messages handed to a helper are collected where the helper is
    # called: a second pass knows the helpers the first one found.
    for _ in range(2):
        found = []
        new = {}
        for path, tree in trees.items():
            collector = _PythonCollector(path, helpers)
            collector.visit(tree)
            found += collector.found
            new.update(collector.new_helpers)
        if set(new) <= set(helpers):
            break
        helpers.update(new)
    return found


# ------------------------------------------------------------------- C++

def _blank_comments(src):
    """The source with comments blanked (lines kept), string and character
    literals intact."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
        elif src[i] in "\"'":
            j = i + 1
            while j < n and src[j] != src[i]:
                j += 2 if src[j] == "\\" else 1
            j += 1
            out.append(src[i:j])
        else:
            j = i + 1
            out.append(src[i])
        i = j
    return "".join(out)


def _balanced(src, start):
    """The text from `start` up to the parenthesis closing the one just
    before it (strings skipped)."""
    depth, i = 1, start
    while i < len(src) and depth:
        c = src[i]
        if c in "\"'":
            j = i + 1
            while j < len(src) and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            i = j
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        i += 1
    return src[start:i - 1]


def _split_top(text, separator):
    """`text` split at `separator` characters outside brackets and strings."""
    parts, depth, current, i = [], 0, [], 0
    while i < len(text):
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < len(text) and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            current.append(text[i:j + 1])
            i = j + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == separator and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
        i += 1
    parts.append("".join(current))
    return parts


LITERALS = re.compile(r'^(\s*"(?:[^"\\]|\\.)*"\s*)+$')
PRINTF = re.compile(r"%[-#0 +]*(\d+|\*)?(\.\d+)?(z|l|ll|h)?[sdfugxc]")


def _unquote(literals):
    text = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', literals))
    return text.replace("\\n", " ").replace('\\"', '"').replace("\\'", "'").replace("\\\\", "\\")


def _scope(src, offset):
    """(start, end) of the top-level definition around `offset`: the core's
    style puts a definition's closing brace alone at the margin."""
    start = src.rfind("\n}", 0, offset)
    end = src.find("\n}", offset)
    return (0 if start < 0 else start + 2), (len(src) if end < 0 else end)


def _render_cpp(expr, src, at, depth):
    """The template of a C++ string expression: a sum of terms."""
    pieces = []
    for term in _split_top(expr.strip(), "+"):
        term = term.strip()
        inner = re.fullmatch(r"std::string\((.*)\)", term, re.S)
        if inner:
            term = inner.group(1).strip()
        if LITERALS.match(term):
            pieces.append(_unquote(term))
            continue
        name = re.fullmatch(r"([A-Za-z_]\w*)(\.(c_str|str|message)\(\))?", term)
        if name and depth > 0:
            value = _cpp_initial_value(src, name.group(1), at)
            if value is not None:
                pieces.append(_render_cpp(value, src, at, depth - 1))
                continue
        pieces.append(HOLE)
    return "".join(pieces)


def _cpp_initial_value(src, name, at):
    """The initializer of the local string `name` declared in the
    definition around offset `at`, when nothing else gives it a value
    there (no later `name =`, `name +=` or `&name`); else None."""
    start, end = _scope(src, at)
    body = src[start:end]
    declared = re.search(rf"(?:const\s+)?(?:std::string|auto)\s+{re.escape(name)}\s*=\s*(?!=)",
                         body)
    if declared is None or declared.start() > at - start:
        return None
    rest = body[declared.end():]
    if re.search(rf"(\b{re.escape(name)}\s*\+?=(?!=)|&{re.escape(name)}\b)", rest):
        return None
    return _split_top(rest, ";")[0]


# Where a C++ message starts: a Status, an exception or a TensorFlow
# error, a line on stderr, or the autotuner's printer (`print_`, stderr by
# default).
CPP_SITES = [
    (re.compile(r"\bStatus::(?!Ok\b)(\w+)\("), "Status::{}"),
    (re.compile(r"\babsl::(\w+Error)\("), "absl::{}"),
    (re.compile(r"\bthrow\s+((?:std::)?[A-Z]?\w+)\("), "throw {}"),
    (re.compile(r"\b(?:std::)?fprintf\(\s*stderr\s*,"), "stderr"),
    (re.compile(r"\bprint_\("), "stderr"),
]
# A message made in one place and sent from another: a function's return
# value that opens with literal text (a reason a caller puts into its
# message), or a local string that opens so and is then returned or sent.
CPP_RETURN = re.compile(r"\breturn\s+(?=(?:std::string\()?\")")
CPP_LOCAL = re.compile(r"\b(?:const\s+)?std::string\s+(\w+)\s*=\s*(?=(?:std::string\()?\")")


def _starts_with(args, name):
    """Whether the message of a site's arguments opens with the string
    `name`: its first term, or a printf format's leading %s given it."""
    parts = _split_top(args, ",")
    first = _split_top(parts[0], "+")[0].strip()
    if LITERALS.match(first) and _unquote(first).startswith("%s") and len(parts) > 1:
        first = _split_top(parts[1], "+")[0].strip()  # fprintf(stderr, "%s...", name)
    return re.fullmatch(rf"{name}(\.(c_str|str|message)\(\))?", first) is not None


def _cpp_file_messages(path, src):
    src = _blank_comments(src)
    found = []

    def line_of(offset):
        return src.count("\n", 0, offset) + 1

    sites = []
    for pattern, kind in CPP_SITES:
        for m in pattern.finditer(src):
            args = _balanced(src, m.end())
            sites.append((m.start(), args))
            label = kind.format(*m.groups())
            if kind == "stderr" and "fprintf" in m.group(0):
                parts = _split_top(args, ",")
                template = PRINTF.sub(HOLE, _unquote(parts[0])) if LITERALS.match(parts[0]) else ""
                # A leading %s of a message made elsewhere: resolve it.
                if template.startswith(HOLE) and len(parts) > 1:
                    head = _render_cpp(parts[1], src, m.start(), 2)
                    template = head + template[len(HOLE):]
            else:
                template = _render_cpp(args, src, m.start(), 2)
            found.append(Message(f"{path}:{line_of(m.start())}", label, tidy(template)))
    for m in CPP_RETURN.finditer(src):
        expr = _split_top(src[m.end():m.end() + 3000], ";")[0]
        found.append(Message(f"{path}:{line_of(m.start())}", "reason",
                             tidy(_render_cpp(expr, src, m.start(), 0))))
    for m in CPP_LOCAL.finditer(src):
        name = m.group(1)
        _, end = _scope(src, m.start())
        later = src[m.end():end]
        sent = re.search(rf"\breturn\s+{name}\b", later) or any(
            m.end() < at < end and _starts_with(args, name) for at, args in sites)
        if sent:
            expr = _split_top(src[m.end():m.end() + 3000], ";")[0]
            found.append(Message(f"{path}:{line_of(m.start())}", "text",
                                 tidy(_render_cpp(expr, src, m.start(), 0))))
    # Three literal words at least: shorter texts are names, formats or
    # fragments ("rank(s) [...]"), not a message's start.
    return [f for f in found if f.literal_words() >= 2]


def cpp_messages():
    found = []
    for folder in CPP_DIRS:
        for root, _, names in os.walk(os.path.join(REPO, folder)):
            for name in sorted(names):
                if name.endswith((".cc", ".h")):
                    path = os.path.join(root, name)
                    with open(path) as f:
                        found += _cpp_file_messages(os.path.relpath(path, REPO), f.read())
    return found


@functools.lru_cache(maxsize=1)
def all_messages():
    return tuple(python_messages() + cpp_messages())


def family(template, words=4):
    """A template's family: the first `words` words of its first run of
    literal text that has two words or more, once a common prefix
    (PREFIXES) is off. None when no run has two words."""
    for run in strip_prefix(template).split(HOLE):
        run = run.strip(" .,;:()[]'\"")
        if len(WORD.findall(run)) < 2:
            continue
        # A clause or an aside ends the leading words, if two are before it.
        for stop in (";", " ("):
            head = run.split(stop)[0]
            if len(WORD.findall(head)) >= 2:
                run = head
        return " ".join(run.split()[:words]).rstrip(" .,;:")
    return None
