"""``python -m keras_ddl.bench``: the command's name only. The benchmarks
live in ``keras_ddl_tools.bench``, which the runtime never imports; this
package just runs them."""
