"""Writes timelines for tests/mpi/test_timeline_mpi.py: first with the default
algorithm, then re-initialised with the flat ring, then rank 0 is killed
mid-job so the test can check the file still loads."""

import os
import signal
import sys

import numpy as np
import tensorflow as tf

import keras_ddl as ddl

out_dir = sys.argv[1]


def workload(tag):
    for step in range(3):
        ddl.timeline_mark(f"{tag} step {step}")
        ddl.allreduce(tf.ones([1000 + step]), name=f"{tag}.single")
        ddl.grouped_allreduce([tf.ones([300]), tf.ones([5], tf.float64)], name=f"{tag}.group")
    ddl.allgather(tf.ones([ddl.rank() + 1, 2]), name=f"{tag}.gather")
    for _ in range(10):
        ddl.allreduce(tf.ones([16]), name=f"{tag}.eager")
    # An argument, not a constant: grappler would fold a collective of a
    # constant and run it once, when it optimises the graph.
    in_graph = tf.function(lambda x: ddl.allreduce(x, name=f"{tag}.in_graph"))
    for _ in range(3):
        in_graph(tf.ones([16]))
    ddl.broadcast(tf.ones([4]), root_rank=1, name=f"{tag}.bcast")


def fit_with_step_marks():
    import keras
    strategy = ddl.DDLStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
    x = np.ones((12, 4), np.float32)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :2])).batch(4).with_options(options)
    model.fit(data, epochs=2, verbose=0, callbacks=[ddl.callbacks.TimelineCallback()])


os.environ["DDL_TIMELINE"] = os.path.join(out_dir, "auto.json")
ddl.init()
workload("auto")
# Above the single pass's 32 KB: the node's general path.
large = ddl.allreduce(tf.ones([100000]), op=ddl.Sum, name="auto.large")
assert np.all(large.numpy() == ddl.size())
fit_with_step_marks()
ddl.shutdown()

os.environ["DDL_TIMELINE"] = os.path.join(out_dir, "flat.json")
os.environ["DDL_ALLREDUCE"] = "flat"
ddl.init()
workload("flat")
large = ddl.allreduce(tf.ones([100000]), op=ddl.Sum, name="flat.large")
assert np.all(large.numpy() == ddl.size())
ddl.shutdown()

os.environ["DDL_TIMELINE"] = os.path.join(out_dir, "killed.json")
ddl.init()
workload("killed")
if ddl.rank() == 0:
    os.kill(os.getpid(), signal.SIGKILL)
ddl.allreduce(tf.ones([3]), name="never.completes")  # rank 0 is gone
print("unreachable", np.zeros(1))
