"""The porting guide's edit table for Horovod's TensorFlow 2 examples
(docs/horovod_porting.md, read by docs/scripts/horovod_tf2_examples.py,
which runs the examples themselves): the edits parse, cover the Keras 2
idioms those examples use, and leave no Horovod import. Runs no MPI job:
the script's runs are documented in the guide."""

import importlib.util
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "docs", "scripts", "horovod_tf2_examples.py")


def load_script():
    spec = importlib.util.spec_from_file_location("horovod_tf2_examples", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The idioms of the two examples that Keras 3 or the front door change, in
# lines of this test's own (the examples themselves are Horovod's).
CUSTOM_LOOP = """import tensorflow as tf
import horovod.tensorflow as hvd
opt = tf.optimizers.SGD(0.01)
hvd.broadcast_variables(opt.variables(), root_rank=0)
"""
FIT = """import horovod.tensorflow.keras as hvd
model.compile(loss=loss, optimizer=opt,
              experimental_run_tf_function=False)
"""


def test_the_guides_edits_port_both_styles(tmp_path):
    script = load_script()
    edits = script.guide_edits()
    assert ("opt.variables()", "opt.variables") in edits, edits
    for name, text, want in [
            ("loop.py", CUSTOM_LOOP, ["import keras_ddl.horovod.tensorflow as hvd",
                                      "hvd.broadcast_variables(opt.variables, root_rank=0)"]),
            ("fit.py", FIT, ["import keras_ddl.horovod.tensorflow.keras as hvd",
                             "jit_compile=False)"])]:
        source, target = tmp_path / name, tmp_path / f"ported_{name}"
        source.write_text(text)
        applied = script.port(str(source), str(target), edits)
        ported = target.read_text()
        assert all(w in ported for w in want), ported
        assert "opt.variables()" not in ported and "experimental_run_tf_function" not in ported
        assert applied and source.read_text() == text  # the original is untouched
        compile(ported, name, "exec")


def test_a_horovod_import_left_is_refused(tmp_path):
    script = load_script()
    source = tmp_path / "other.py"
    source.write_text("from horovod.torch import DistributedOptimizer\n")
    with pytest.raises(SystemExit, match="a Horovod import is left"):
        script.port(str(source), str(tmp_path / "out.py"), script.guide_edits())
