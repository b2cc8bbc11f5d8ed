"""Builds keras_ddl: the Python package plus two shared libraries.

- ``libddl_core.so``: the collective core (custom_ops/common, transport,
  algorithms, engine), plain C++17 over MPI.
- ``ddl_tf_ops.so``: the TensorFlow ops (custom_ops/bindings/tf_ops.cc), linked to
  the core and compiled with the installed TensorFlow's flags.

Both land in the package's top directory, with ``build_info.json`` recording
what they were built against and a copy of the settings table
(custom_ops/common/settings.def) for ddlrun, which reads it without loading
the libraries. TensorFlow and MPI must be installed before
the build, hence ``pip install --no-build-isolation`` (see README.md).

MPI selection:
- default: the ``mpich`` PyPI wheel in this environment (mpi.h, libmpi.so);
- ``DDL_MPI_CXX=/path/to/mpicxx``: compile and link with a cluster MPI's
  C++ compiler wrapper (OpenMPI, Intel MPI, a vendor MPICH);
- ``DDL_MPI_PREFIX=/opt/mpi``: an MPI installed under PREFIX/include and
  PREFIX/lib, compiled with ``CXX`` (default g++).
"""

import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
OPS_DIR = os.path.join(HERE, "custom_ops")
# The core, layer by layer (custom_ops/README.md), and its C API binding.
CORE_SOURCES = sorted(
    glob.glob(os.path.join(OPS_DIR, "common", "*.cc"))
    + glob.glob(os.path.join(OPS_DIR, "transport", "*.cc"))
    + glob.glob(os.path.join(OPS_DIR, "algorithms", "*.cc"))
    + glob.glob(os.path.join(OPS_DIR, "negotiation", "*.cc"))
    + glob.glob(os.path.join(OPS_DIR, "topology", "*.cc"))
    + glob.glob(os.path.join(OPS_DIR, "health", "*.cc"))
    + glob.glob(os.path.join(OPS_DIR, "tuning", "*.cc"))
    + glob.glob(os.path.join(OPS_DIR, "engine", "*.cc"))
    + [os.path.join(OPS_DIR, "bindings", "c_api.cc")])
TF_SOURCES = [os.path.join(OPS_DIR, "bindings", "tf_ops.cc")]
# The DDL_* settings table: compiled into the core, copied into the package
# for ddlrun, which reads it at run time.
SETTINGS_TABLE = os.path.join(OPS_DIR, "common", "settings.def")
HEADERS = sorted(glob.glob(os.path.join(OPS_DIR, "**", "*.h"), recursive=True)) + [SETTINGS_TABLE]


def _fail(message):
    sys.stderr.write(f"\nkeras_ddl build error: {message}\n\n")
    raise SystemExit(1)


def _find_wheel_mpi():
    """Prefix of the mpich PyPI wheel (it installs include/ and lib/ there)."""
    candidates = [sys.prefix, sys.exec_prefix, sys.base_prefix]
    try:
        import site
        candidates.append(site.getuserbase())
    except Exception:  # pragma: no cover - site may be stripped down
        pass
    for prefix in candidates:
        if os.path.exists(os.path.join(prefix, "include", "mpi.h")) and glob.glob(
                os.path.join(prefix, "lib", "libmpi.so*")):
            return prefix
    return None


def mpi_toolchain():
    """(compiler argv, compile flags, link flags, description)."""
    cxx = shlex.split(os.environ.get("CXX", "g++"))
    wrapper = os.environ.get("DDL_MPI_CXX")
    if wrapper:
        return shlex.split(wrapper), [], [], f"compiler wrapper {wrapper}"
    prefix = os.environ.get("DDL_MPI_PREFIX") or _find_wheel_mpi()
    if not prefix:
        _fail("no MPI found. Install the mpich wheel (pip install mpich), or set "
              "DDL_MPI_CXX to your MPI's C++ compiler wrapper, or DDL_MPI_PREFIX to its prefix.")
    include, lib = os.path.join(prefix, "include"), os.path.join(prefix, "lib")
    if not os.path.exists(os.path.join(include, "mpi.h")):
        _fail(f"DDL_MPI_PREFIX={prefix} has no include/mpi.h")
    source = "DDL_MPI_PREFIX" if os.environ.get("DDL_MPI_PREFIX") else "mpich wheel"
    return (cxx, [f"-I{include}"], [f"-L{lib}", "-lmpi", f"-Wl,-rpath,{lib}"],
            f"{source} at {prefix}")


def tensorflow_flags():
    try:
        import tensorflow as tf
    except ImportError:
        _fail("TensorFlow must be installed before building keras_ddl's ops "
              "(pip install -r requirements.txt), and the build must see it "
              "(pip install --no-build-isolation .).")
    return tf.__version__, tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()


def _run(argv):
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        _fail(f"command failed:\n  {' '.join(argv)}\n{proc.stderr[-6000:]}")


class BuildCustomOps(build_ext):
    """Compiles the two libraries instead of setuptools' per-extension build."""

    def build_extension(self, ext):
        out_dir = os.path.dirname(self.get_ext_fullpath(ext.name))
        os.makedirs(out_dir, exist_ok=True)
        obj_dir = os.path.join(self.build_temp, "ddl_objects")
        os.makedirs(obj_dir, exist_ok=True)
        cxx, mpi_cflags, mpi_ldflags, mpi_desc = mpi_toolchain()
        tf_version, tf_cflags, tf_ldflags = tensorflow_flags()
        common = ["-std=c++17", "-O3", "-fPIC", "-pthread", "-Wall"]
        # The core's ABI must match TensorFlow's (its flags set _GLIBCXX_USE_CXX11_ABI).
        abi = [f for f in tf_cflags if f.startswith("-D_GLIBCXX_USE_CXX11_ABI")]

        def compile_one(src, extra):
            obj = os.path.join(obj_dir, os.path.relpath(src, OPS_DIR).replace(os.sep, "_") + ".o")
            _run(cxx + common + abi + extra + ["-c", src, "-o", obj])
            return obj

        jobs = int(os.environ.get("DDL_BUILD_JOBS", os.cpu_count() or 2))
        tf_extra = tf_cflags + ["-Wno-deprecated-declarations", "-O2"]
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            # Only the core sees MPI's headers (and only its transport/ uses
            # them); the TensorFlow ops speak to the engine's interfaces.
            core_objs = list(pool.map(lambda s: compile_one(s, mpi_cflags), CORE_SOURCES))
            tf_objs = list(pool.map(lambda s: compile_one(s, tf_extra), TF_SOURCES))
        core_lib = os.path.join(out_dir, "libddl_core.so")
        _run(cxx + common + ["-shared"] + core_objs + mpi_ldflags + ["-o", core_lib])
        ops_lib = os.path.join(out_dir, "ddl_tf_ops.so")
        _run(cxx + common + ["-shared"] + tf_objs
             + [f"-L{out_dir}", "-l:libddl_core.so", "-Wl,-rpath,$ORIGIN"]
             + tf_ldflags + ["-o", ops_lib])
        with open(os.path.join(out_dir, "build_info.json"), "w") as f:
            json.dump({"tensorflow": tf_version, "mpi": mpi_desc, "compiler": " ".join(cxx),
                       "python": sys.version.split()[0]}, f, indent=2)
        table = os.path.join(out_dir, "settings.def")
        shutil.copyfile(SETTINGS_TABLE, table)
        self._ddl_outputs = [core_lib, ops_lib, os.path.join(out_dir, "build_info.json"), table]

    def get_outputs(self):
        return getattr(self, "_ddl_outputs", [])

    def copy_extensions_to_source(self):
        # Editable installs (pip install -e .): the libraries go next to the
        # package's sources, which is where Python then imports them from.
        package_dir = os.path.join(HERE, "src", "keras_ddl")
        for path in getattr(self, "_ddl_outputs", []):
            if os.path.dirname(os.path.abspath(path)) != package_dir:
                shutil.copy2(path, package_dir)


def gpu_requirements():
    """The ``gpu`` extra: TensorFlow's CUDA libraries (``tensorflow[and-cuda]``).

    The ops are compiled against the TensorFlow installed at build time, so
    the extra pins that same version: ``pip install ".[gpu]"`` then adds the
    CUDA wheels beside it instead of swapping TensorFlow for another release
    after the build (which would leave ops built for the old one).
    """
    try:
        from importlib.metadata import PackageNotFoundError, version
        return [f"tensorflow[and-cuda]=={version('tensorflow')}"]
    except PackageNotFoundError:
        return ["tensorflow[and-cuda]>=2.16"]


setup(
    name="keras_ddl",
    version="0.1.0",
    description="Synchronous data-parallel training for Keras 3 / TensorFlow over MPI",
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    # The src layout: the repository root is not an importable copy of the
    # package, so tests and tools always import the installed one.
    package_dir={"": "src"},
    # keras_ddl_launcher is ddlrun: a package of its own, so that starting
    # it imports no TensorFlow (keras_ddl's __init__ does).
    packages=find_packages(where="src", include=["keras_ddl", "keras_ddl.*", "keras_ddl_tools",
                                                 "keras_ddl_tools.*", "keras_ddl_launcher"]),
    # The sources are compiled by BuildCustomOps; listed as dependencies so
    # a rebuild (pip install -e ., setup.py build_ext) sees what changed.
    ext_modules=[Extension("keras_ddl.ddl_tf_ops", sources=[],
                           depends=CORE_SOURCES + TF_SOURCES + HEADERS)],
    cmdclass={"build_ext": BuildCustomOps},
    # TensorFlow is not listed: the ops must be built against the TensorFlow
    # already installed (tensorflow, tensorflow-cpu or a CUDA build), and
    # listing one distribution would pull it in beside another.
    install_requires=["keras>=3.0", "mpi4py>=4.0", "numpy"],
    extras_require={"mpich": ["mpich"], "test": ["pytest"], "study": ["matplotlib"],
                    "gpu": gpu_requirements()},
    entry_points={"console_scripts": ["ddlrun = keras_ddl_launcher.ddlrun:main"]},
    zip_safe=False,
)
