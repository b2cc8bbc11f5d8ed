"""``ddlrun``: launch a training script on N processes through the MPI launcher.

A package of its own, beside keras_ddl: ``import keras_ddl`` imports
TensorFlow (the Keras-serializable classes register when keras_ddl is
imported), which takes seconds and which the launcher never needs. Nothing
here imports keras_ddl, TensorFlow or Keras; the ranks it starts import
keras_ddl as usual.
"""
