"""ResNet-50 on ImageNet-1k, synchronous data parallel (Goyal et al. 2017 recipe).

    ddlrun -np 8 python examples/resnet50_imagenet1k.py --data-dir /data/imagenet1k \\
        --global-batch 8192 --optimizer sgd --epochs 90
    ddlrun -np 2 python examples/resnet50_imagenet1k.py --synthetic --steps-per-epoch 20

Defaults: batch 8192, 90 epochs, SGD + Nesterov momentum 0.9, lr = 0.1 * batch / 256
with 5 warmup epochs and polynomial decay, weight decay 1e-4 on kernels only, label
smoothing 0.1. After every epoch the 50,000 validation images (--eval-split,
TFRecords validation-* next to the training ones) are evaluated and their top-1
printed as val_top1. See imagenet_common.py and docs/examples.md for every flag.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import imagenet_common  # noqa: E402

DEFAULTS = dict(global_batch=8192, epochs=90, warmup_epochs=5, num_classes=1000,
                train_images=1281167, eval_images=50000, optimizer="sgd", weight_decay=1e-4,
                depth=50)

if __name__ == "__main__":
    sys.exit(imagenet_common.main(__doc__, DEFAULTS))
