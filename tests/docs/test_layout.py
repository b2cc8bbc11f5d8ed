"""The package's layering, read from the sources (no import of TensorFlow
except in the last test): which folder may import or include which, no
import cycle, the runtime never importing the tools, every folder saying
what lives there, and every import path the docs use resolving."""

import ast
import glob
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(REPO, "src")
PACKAGE = os.path.join(SRC, "keras_ddl")
OPS = os.path.join(REPO, "custom_ops")


def module_name(path):
    rel = os.path.relpath(path, SRC)[:-3].split(os.sep)
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def python_modules(top):
    return {module_name(p): p for p in glob.glob(os.path.join(SRC, top, "**", "*.py"),
                                                  recursive=True)}


# The top-level packages: the runtime, ddlrun, and the tools.
PACKAGES = ("keras_ddl", "keras_ddl_launcher", "keras_ddl_tools")


def imports_of(path, name):
    """Every keras_ddl* module `path` imports, at any depth of its code."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module
            found.add(stem)
            found.update(f"{stem}.{a.name}" for a in node.names)
    return {m for m in found if m.split(".")[0] in PACKAGES}


def graph():
    modules = {k: v for top in PACKAGES for k, v in python_modules(top).items()}
    return {name: {m for m in imports_of(path, name) if m in modules and m != name}
            for name, path in modules.items()}


def layer(module):
    parts = module.split(".")
    return parts[1] if parts[0] == "keras_ddl" and len(parts) > 1 else parts[0]


# layer -> the layers of keras_ddl it must not import (anything else is fine)
FORBIDDEN = {
    "common": {"tensorflow", "keras", "horovod"},
    "tensorflow": {"keras", "horovod"},
    "keras": {"horovod"},
}


def test_python_layers_import_only_downwards():
    wrong = [f"{m} imports {dep}" for m, deps in graph().items() for dep in deps
             if dep.startswith("keras_ddl.") and layer(dep) in FORBIDDEN.get(layer(m), ())]
    assert wrong == []


def test_ddlrun_imports_neither_keras_ddl_nor_tensorflow():
    """keras_ddl_launcher (ddlrun) starts without TensorFlow: it imports no
    keras_ddl module (keras_ddl/__init__.py imports TensorFlow), no tool,
    and neither TensorFlow nor Keras; keras_ddl does not import it."""
    wrong = [f"{m} imports {dep}" for m, deps in graph().items() for dep in deps
             if (m.split(".")[0] == "keras_ddl_launcher") != (dep.split(".")[0]
                                                              == "keras_ddl_launcher")]
    for path in glob.glob(os.path.join(SRC, "keras_ddl_launcher", "*.py")):
        for node in ast.walk(ast.parse(open(path).read(), path)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            wrong += [f"{os.path.basename(path)} imports {n}" for n in names
                      if n.split(".")[0] in ("tensorflow", "keras")]
    assert wrong == []


def test_the_runtime_never_imports_the_tools():
    # keras_ddl.bench and keras_ddl.cluster are the tools' commands under
    # their documented names, nothing else.
    commands = ("keras_ddl.bench", "keras_ddl.cluster")
    wrong = [f"{m} imports {dep}" for m, deps in graph().items() if m.startswith("keras_ddl.")
             or m == "keras_ddl" for dep in deps
             if dep.startswith("keras_ddl_tools") and not m.startswith(commands)]
    assert wrong == []


def test_no_import_cycle():
    edges = graph()
    # A package imports its own submodules by definition; a cycle through
    # one's __init__ still counts when a submodule imports the package back.
    seen, on_stack, cycles = set(), [], []

    def visit(m):
        if m in on_stack:
            cycles.append(on_stack[on_stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        on_stack.append(m)
        for dep in sorted(edges[m]):
            if not m.startswith(dep + "."):   # a submodule naming its parent package
                visit(dep)
        on_stack.pop()

    for m in sorted(edges):
        visit(m)
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_every_folder_says_what_lives_there():
    missing = []
    for init in glob.glob(os.path.join(PACKAGE, "**", "__init__.py"), recursive=True) + \
            glob.glob(os.path.join(SRC, "keras_ddl_tools", "**", "__init__.py"), recursive=True) + \
            [os.path.join(SRC, "keras_ddl_launcher", "__init__.py")]:
        doc = ast.get_docstring(ast.parse(open(init).read()))
        if not doc or len(doc.split()) < 8:
            missing.append(os.path.relpath(init, REPO))
    for folder in [OPS] + sorted(glob.glob(os.path.join(OPS, "*", ""))):
        readme = os.path.join(folder, "README.md")
        if not os.path.exists(readme) or len(open(readme).read().split()) < 20:
            missing.append(os.path.relpath(readme, REPO))
    assert missing == []


# What Python's import machinery is for code to change: a module is a file,
# found the ordinary way, never one planted in sys.modules, a package whose
# __path__ is rewritten, or an import hook.
IMPORT_STATE = {"modules", "meta_path", "path_hooks", "path_importer_cache"}
MUTATORS = {"update", "setdefault", "__setitem__", "__delitem__", "pop", "popitem", "clear",
            "append", "extend", "insert", "remove"}


def import_tricks(source, path="<source>"):
    """The lines of `source` that change sys.modules (or the import hooks)
    or a __path__: an assignment, augmented assignment or del of it or of
    an item, or a call of a mutating method on it."""
    def changed(node):   # sys.modules, sys.meta_path, ..., or a __path__
        if isinstance(node, ast.Subscript):
            return changed(node.value)
        if isinstance(node, ast.Name):
            return node.id == "__path__"
        return isinstance(node, ast.Attribute) and (node.attr == "__path__" or (
            node.attr in IMPORT_STATE and isinstance(node.value, ast.Name)
            and node.value.id.lstrip("_") == "sys"))

    found = []
    for node in ast.walk(ast.parse(source, path)):
        targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else
                   [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else
                   [node.func.value] if isinstance(node, ast.Call) and isinstance(
                       node.func, ast.Attribute) and node.func.attr in MUTATORS else [])
        if any(changed(t) for t in targets):
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_import_tricks_are_found():
    for source in ("import sys\nsys.modules[__name__ + '.x'] = object()",
                   "import sys as _sys\n_sys.modules['a'] = None",
                   "import sys\nsys.modules.setdefault('a', None)",
                   "import sys\ndel sys.modules['a']", "__path__ = ['elsewhere']",
                   "__path__.append('elsewhere')", "import os\nos.__path__ += ['x']",
                   "import sys\nsys.meta_path.insert(0, object())"):
        assert import_tricks(source), source
    for source in ("import sys\nloaded = 'mpi4py.MPI' in sys.modules",
                   "import sys\nv = sys.modules['keras'].__version__",
                   "import sys\nsys.path.pop(0)", "path = ['x']\npath.append('y')"):
        assert import_tricks(source) == [], source


def test_no_module_under_src_plays_import_tricks():
    files = glob.glob(os.path.join(SRC, "**", "*.py"), recursive=True)
    assert len(files) > 50, files   # the scan found the sources
    found = [t for path in files
             for t in import_tricks(open(path).read(), os.path.relpath(path, REPO))]
    assert found == [], "\n".join(found)


# C++: which folder may include which (custom_ops/README.md draws it); a
# folder may always include its own files. No cycle: each folder names only
# folders further down this table.
CPP_INCLUDES = {
    "bindings": {"engine"},
    "engine": {"tuning", "health", "negotiation", "algorithms", "topology", "transport",
               "common"},
    "tuning": {"algorithms", "topology", "transport", "common"},
    "health": {"transport", "common"},
    "negotiation": {"transport", "common"},
    "algorithms": {"topology", "transport", "common"},
    "topology": {"transport", "common"},
    "transport": {"common"},
    "common": set(),
}


def cpp_folders():
    return sorted(f for f in os.listdir(OPS) if os.path.isdir(os.path.join(OPS, f)))


def cpp_files(folder):
    return sorted(f for f in os.listdir(os.path.join(OPS, folder))
                  if f.endswith((".cc", ".h", ".def")))


def cpp_includes():
    for folder in cpp_folders():
        for name in cpp_files(folder):
            for line in open(os.path.join(OPS, folder, name)):
                m = re.match(r'\s*#include\s+[<"]([^">]+)[">]', line)
                if m:
                    yield folder, f"{folder}/{name}", m.group(1)


def test_cpp_table_names_every_folder_once_in_order():
    assert sorted(CPP_INCLUDES) == cpp_folders()
    order = list(CPP_INCLUDES)
    wrong = [f"{a} may include {b}, which comes before it" for a, allowed in CPP_INCLUDES.items()
             for b in allowed if order.index(b) <= order.index(a)]
    assert wrong == []


def test_cpp_folders_include_only_what_the_table_allows():
    wrong = []
    for folder, path, header in cpp_includes():
        if not header.startswith("../"):
            continue
        target = os.path.normpath(os.path.join(folder, header)).split(os.sep)[0]
        if target != folder and target in CPP_INCLUDES and \
                target not in CPP_INCLUDES[folder]:
            wrong.append(f"{path} includes {header}")
    assert wrong == []


def test_every_cpp_file_is_named_in_its_folders_readme():
    missing = []
    for folder in cpp_folders():
        readme = open(os.path.join(OPS, folder, "README.md")).read()
        for name in cpp_files(folder):
            stem = name.rsplit(".", 1)[0]
            if not re.search(rf"`{re.escape(name)}`|`{re.escape(stem)}\.(\*|{{)", readme):
                missing.append(f"{folder}/{name}")
    assert missing == []


def test_no_cpp_folder_holds_more_than_a_third_of_the_core():
    lines = {folder: sum(len(open(os.path.join(OPS, folder, n)).readlines())
                         for n in cpp_files(folder) if n.endswith((".cc", ".h")))
             for folder in cpp_folders()}
    total = sum(lines.values())
    assert total > 5000, lines   # the count found the core
    assert {f: n for f, n in lines.items() if 3 * n > total} == {}, (total, lines)


# The network's system headers: every byte the core moves goes through transport/.
SOCKET_HEADERS = {"sys/socket.h", "poll.h", "netinet/in.h", "netinet/tcp.h", "linux/tcp.h",
                  "arpa/inet.h", "ifaddrs.h", "netdb.h"}


def binding_may_include(header):
    """Whether a file of bindings/ may include `header`: of the core only
    engine/runtime.h, spelled "../engine/runtime.h". A path is taken from
    bindings/ and from custom_ops/ (an -I there would make either work), so
    no other header of the core slips in by another spelling; bindings/'s
    own files and system or TensorFlow headers are fine."""
    found = {os.path.relpath(os.path.normpath(os.path.join(base, header)), OPS)
             for base in (os.path.join(OPS, "bindings"), OPS)
             if os.path.isfile(os.path.join(base, header))}
    if header == "../engine/runtime.h":
        return True
    return not header.startswith("../") and all(f.startswith("bindings" + os.sep)
                                                for f in found)


def test_the_bindings_may_include_only_the_runtimes_header():
    assert binding_may_include("../engine/runtime.h")
    for header in ("vector", "tensorflow/core/framework/op.h", "c_api.cc"):
        assert binding_may_include(header), header
    for header in ("../common/reduce_kernels.h", "common/types.h", "../engine/engine.h",
                   "engine/runtime.h", "../common/no_such.h"):
        assert not binding_may_include(header), header


def test_cpp_mpi_tensorflow_and_the_bindings_stay_in_their_files():
    wrong = []
    for folder, path, header in cpp_includes():
        if header == "mpi.h" and not re.match(r"transport/mpi_\w+\.(cc|h)$", path):
            wrong.append(f"{path} includes mpi.h")
        if header.startswith("tensorflow/") and path != "bindings/tf_ops.cc":
            wrong.append(f"{path} includes {header}")
        if folder == "bindings" and not binding_may_include(header):
            wrong.append(f"{path} includes {header}: the bindings reach the core through "
                         "engine/runtime.h only")
        if header.startswith("../../"):
            wrong.append(f"{path} includes {header}, outside custom_ops")
        if header in SOCKET_HEADERS and folder != "transport":
            wrong.append(f"{path} includes {header}: sockets are transport/'s "
                         "(probe_socket.h, socket_bytes.h)")
    assert wrong == []


def test_the_bindings_door_shows_no_engine():
    """The bindings' one engine header, engine/runtime.h, includes no other
    header of the core but work.h (the collective a binding hands in) and
    what that includes: no engine.h, context.h or the layers under them."""
    found = [header for folder, path, header in cpp_includes()
             if path == "engine/runtime.h" and not re.match(r"^[a-z_]+$", header)]
    assert found == ["work.h"]
    work = [header for folder, path, header in cpp_includes()
            if path == "engine/work.h" and header.endswith(".h")]
    assert set(work) <= {"../common/types.h", "../negotiation/message.h"}, work


def documented_import_paths():
    """Module paths and names the README, docs/ and examples/ import."""
    paths = set()
    files = [os.path.join(REPO, "README.md")] + glob.glob(os.path.join(REPO, "docs", "*.md")) + \
        glob.glob(os.path.join(REPO, "docs", "*", "*.md")) + \
        glob.glob(os.path.join(REPO, "examples", "*.py"))
    for path in files:
        if "performance-notes" in path:
            continue
        text = open(path).read()
        for m in re.finditer(r"^\s*(?:>>> )?from (keras_ddl[\w.]*) import \(?([\w, ]+)", text,
                             re.M):
            paths.update(f"{m.group(1)}:{n.strip().split(' as ')[0]}"
                         for n in m.group(2).split(",") if n.strip())
        for m in re.finditer(r"^\s*(?:>>> )?import (keras_ddl[\w.]*)", text, re.M):
            paths.add(m.group(1))
        for m in re.finditer(r"(?<![\w.])(?:ddl|keras_ddl)\.([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*)",
                             text):
            dotted = m.group(1)
            if dotted.split(".")[0] not in ("bench", "cluster"):   # commands, run below
                paths.add("keras_ddl." + dotted.rstrip("."))
    return sorted(paths)


def test_every_import_path_the_docs_use_resolves():
    paths = documented_import_paths()
    assert len(paths) > 50, paths   # the scan found the docs' names
    script = (
        "import importlib, sys\n"
        "import keras_ddl\n"
        "bad = []\n"
        "for p in sys.argv[1:]:\n"
        "    module, _, name = p.partition(':')\n"
        "    try:\n"
        "        if name:\n"
        "            getattr(importlib.import_module(module), name)\n"
        "            continue\n"
        "        try:\n"
        "            importlib.import_module(module)\n"
        "        except ImportError:\n"
        "            parent, _, attr = module.rpartition('.')\n"
        "            obj = importlib.import_module('keras_ddl')\n"
        "            for part in module.split('.')[1:]:\n"
        "                obj = getattr(obj, part)\n"
        "    except Exception as e:\n"
        "        bad.append(f'{p}: {type(e).__name__}: {e}')\n"
        "print('\\n'.join(bad))\n"
        "sys.exit(1 if bad else 0)\n")
    proc = subprocess.run([sys.executable, "-c", script, *paths], capture_output=True,
                          text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]


@pytest.mark.parametrize("command", ["keras_ddl.bench", "keras_ddl.cluster",
                                     "keras_ddl_tools.bench", "keras_ddl_tools.cluster"])
def test_documented_commands_answer(command):
    proc = subprocess.run([sys.executable, "-m", command, "--help"], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: python -m keras_ddl."), proc.stdout[:200]
