"""Workloads: the gradient tensors of ResNet-50 / ResNet-101 and the point of
the backward pass at which each is ready."""

import functools
from dataclasses import dataclass

from .links import FP32

@dataclass(frozen=True)
class Tensor:
    name: str
    nbytes: int
    ready: float      # fraction of the backward pass done when this gradient exists


@dataclass(frozen=True)
class Workload:
    name: str
    params: int
    macs: int         # multiply-accumulates of one forward pass of one image
    tensors: tuple    # Tensor, in the order the backward pass produces them

    @property
    def nbytes(self):
        return self.params * FP32


_RESNET_BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}


def _resnet_layers(depth, classes, size=224):
    """(name, weight shape elements, output channels, forward MACs) of every
    layer of ResNet v1 (He et al. 2016, bottleneck blocks, stride on the
    first 1x1 of a block as in the original Caffe model and Keras' ResNet50;
    convolutions without bias, each followed by batch norm)."""
    layers = []
    h = size // 2
    layers.append(("conv1", 7 * 7 * 3 * 64, 64, 7 * 7 * 3 * 64 * h * h))
    h //= 2  # 3x3/2 max pool
    cin = 64
    for stage, (blocks, mid) in enumerate(zip(_RESNET_BLOCKS[depth], (64, 128, 256, 512))):
        out = 4 * mid
        for b in range(blocks):
            ho = h // 2 if (b == 0 and stage > 0) else h
            prefix = f"res{stage + 2}.{b}"
            layers.append((prefix + ".a", cin * mid, mid, cin * mid * ho * ho))
            layers.append((prefix + ".b", 9 * mid * mid, mid, 9 * mid * mid * ho * ho))
            layers.append((prefix + ".c", mid * out, out, mid * out * ho * ho))
            if b == 0:
                layers.append((prefix + ".proj", cin * out, out, cin * out * ho * ho))
            cin, h = out, ho
    layers.append(("fc", cin * classes, None, cin * classes))
    return layers


def resnet(depth, classes=1000, name=None):
    """The gradient list of a ResNet, in backward order, with ready times.

    Assumption (stated in docs/scaling_model.md): the backward pass visits
    layers in reverse and spends time in proportion to each layer's MACs;
    a layer's weight gradient (and its batch-norm gradients) is ready when
    the backward pass has finished that layer."""
    layers = _resnet_layers(depth, classes)
    total = sum(l[3] for l in layers)
    done = 0
    tensors = []
    params = 0
    for lname, weights, channels, macs in reversed(layers):
        done += macs
        ready = done / total
        if channels is None:  # fully connected: weight and bias
            parts = [(lname + ".w", weights), (lname + ".b", classes)]
        else:
            parts = [(lname + ".w", weights), (lname + ".bn.gamma", channels),
                     (lname + ".bn.beta", channels)]
        for pname, count in parts:
            tensors.append(Tensor(pname, count * FP32, ready))
            params += count
    return Workload(name or f"resnet{depth}", params, total, tuple(tensors))


@functools.lru_cache(maxsize=None)
def workload(name):
    """resnet50, resnet101 (1000 classes) or resnet101-22k (21841 classes,
    the ImageNet-22k model of the PowerAI DDL run)."""
    if name == "resnet50":
        return resnet(50)
    if name == "resnet101":
        return resnet(101)
    if name in ("resnet101-22k", "resnet101_22k"):
        return resnet(101, classes=21841, name="resnet101-22k")
    raise ValueError(f"unknown model {name!r}; choose resnet50, resnet101 or resnet101-22k")


MODELS = ("resnet50", "resnet101", "resnet101-22k")
