"""The Keras layer: what a training script puts in ``compile`` and ``fit``.

- ``distributed_optimizer``: ``DistributedOptimizer``,
  ``DistributedGradientTape`` and their partial forms;
  ``gradient_overlap``: the gradient allreduces started as backprop makes
  them; ``loss_scale``: a ``LossScaleOptimizer`` whose skip decision
  agrees across ranks.
- ``strategy``: ``DDLStrategy`` (the ``tf.distribute`` internals it needs).
- ``callbacks``, ``checkpoint`` (``BackupAndRestore``, with ``backup_store``,
  its files, and ``fit_input``, fit's input and where it stands): broadcast,
  metric averaging, learning-rate warmup and schedules, backups and resume.
- ``schedules``, ``optimizers`` (LARS): the large-batch recipes.
- ``data``: input pipelines sharded by rank, and sample positions that
  survive a restart at another world size; ``sync_batch_norm``:
  ``SyncBatchNormalization``.

Users import these as ``keras_ddl.callbacks``, ``keras_ddl.optimizers``,
``keras_ddl.schedules`` and ``keras_ddl.data`` (aliases of the modules here).
"""
