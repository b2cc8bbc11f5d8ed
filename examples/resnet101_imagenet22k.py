"""ResNet-101 on ImageNet-22k, synchronous data parallel: the PowerAI DDL headline
run (batch 5120 on 256 GPUs, 33.8% top-1 in 7 hours), on keras_ddl.

    ddlrun -np 256 --hostfile hosts.txt python examples/resnet101_imagenet22k.py \\
        --data-dir /data/imagenet22k --global-batch 5120 --optimizer lars
    ddlrun -np 2 python examples/resnet101_imagenet22k.py --synthetic --steps-per-epoch 20

Defaults: 21,841 classes, ~7.5 M training images, batch 5120, 40 epochs, LARS with
trust coefficient eeta = 0.001 (You, Gitman & Ginsburg 2017, Algorithm 1: every
variable adapted; no weight decay on BatchNorm parameters and biases), peak
lr = 10 x batch / 256 (keras_ddl's LARS rate: README.md "Large-batch training",
examples/large_batch_study.py) with 5 warmup epochs and polynomial decay; with
--optimizer sgd, 0.1 x batch / 256. After every epoch the held-out split
(--eval-split, TFRecords <split>-* next to the training ones) is evaluated and
its top-1 printed as val_top1. See imagenet_common.py and docs/examples.md.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import imagenet_common  # noqa: E402

DEFAULTS = dict(global_batch=5120, epochs=40, warmup_epochs=5, num_classes=21841,
                train_images=7500000, eval_images=50000, optimizer="lars",
                weight_decay=5e-5, depth=101)

if __name__ == "__main__":
    sys.exit(imagenet_common.main(__doc__, DEFAULTS))
