"""The LeNet family: ``lenet5`` and RingSFL's ``lenet5-ringsfl``, one layer per block (12 blocks).

* ``lenet5`` -- LeNet-5 (LeCun et al., "Gradient-based learning applied to
  document recognition", 1998) with ReLU and max pooling, in the 12 blocks
  RingSFL (Shen et al., "Ring-based Split Federated Learning") divides it into.
* ``lenet5-ringsfl`` -- RingSFL's LeNet exactly (``LeNet_Mnist`` of
  github.com/ShenJinglong/DistRingSFL): as ``lenet5`` with average pooling.
"""

from __future__ import annotations

from torch import nn

from fl_app.models.blocks import linear_blocks, out_shape


def lenet5(input_shape: tuple[int, int, int], num_classes: int,
           pool: type[nn.Module] = nn.MaxPool2d) -> list[tuple[str, nn.Module]]:
    """LeNet-5 with ReLU and max pooling (``pool``: the pooling layer class), in 12 blocks.

    Inputs smaller than 32x32 (e.g. 28x28 MNIST) get ``padding=2`` in conv1,
    the usual MNIST form, so 28x28 gives the classic 16x5x5 feature map;
    32x32 inputs use no padding (the original LeNet-5, also 16x5x5).
    """
    c, h, w = input_shape
    pad = 2 if min(h, w) < 32 else 0
    front: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Conv2d(c, 6, 5, 1, pad)),
        ("relu1", nn.ReLU()),
        ("pool1", pool(2, 2)),
        ("conv2", nn.Conv2d(6, 16, 5)),
        ("relu2", nn.ReLU()),
        ("pool2", pool(2, 2)),
        ("flatten", nn.Flatten()),
    ]
    (flat,) = out_shape([m for _, m in front], input_shape, "lenet5")
    return front + linear_blocks(flat, (120, 84), num_classes, first_relu=3)


def lenet5_ringsfl(input_shape: tuple[int, int, int], num_classes: int) -> list[tuple[str, nn.Module]]:
    """RingSFL's LeNet (``LeNet_Mnist`` in ShenJinglong/DistRingSFL ``model/LeNet.py``): :func:`lenet5`
    with average pooling, the same 12 blocks."""
    return lenet5(input_shape, num_classes, pool=nn.AvgPool2d)
