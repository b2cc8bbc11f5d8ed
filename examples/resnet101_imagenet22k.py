"""ResNet-101 on ImageNet-22k, synchronous data parallel (the PowerAI DDL headline run:
batch 5120 on 256 GPUs, 33.8% top-1 in 7 hours).

    ddlrun -np 256 --hostfile hosts.txt python examples/resnet101_imagenet22k.py \
        --data-dir /data/imagenet22k --global-batch 5120 --optimizer lars
    ddlrun -np 2 python examples/resnet101_imagenet22k.py --synthetic --steps-per-epoch 20

Defaults: 21,841 classes, ~7.5 M images, batch 5120, LARS (trust ratio; no decay or
adaptation on BN and biases), lr = 0.1 * batch / 256 with warmup and polynomial decay.
See imagenet_common.py and docs/examples.md for every flag.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import imagenet_common  # noqa: E402

DEFAULTS = dict(global_batch=5120, epochs=40, warmup_epochs=5, num_classes=21841,
                train_images=7500000, base_lr=0.1, optimizer="lars", weight_decay=5e-5,
                depth=101)

if __name__ == "__main__":
    sys.exit(imagenet_common.main(__doc__.split("\n")[0], DEFAULTS))
