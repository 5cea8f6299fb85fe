"""VGG-16 with BatchNorm for CIFAR-size input, in RingSFL's 16 blocks (``vgg16``).

VGG-16 (Simonyan & Zisserman 2014), blocks ``conv1..conv13, fc1..fc3``
(pools folded into conv2, 4, 7, 10, 13; classifier 512-512-classes).
GAPSL's client part (the first four conv layers) is ``cut-layer=4``
(128x8x8 activation); GAS's cuts after torchvision layers 10, 17, 24, 31
(the pools of the plain VGG-16 ``features``) are cut-layers 4, 7, 10, 13.
1x28x28 input is zero-padded to 32x32 by conv1's padding.
"""

from __future__ import annotations

from torch import nn


#: VGG-16's 13 conv layers: output channels, and whether a 2x2 max pool follows.
_VGG16_CONVS: tuple[tuple[int, bool], ...] = (
    (64, False), (64, True),
    (128, False), (128, True),
    (256, False), (256, False), (256, True),
    (512, False), (512, False), (512, True),
    (512, False), (512, False), (512, True),
)


def vgg16(input_shape: tuple[int, int, int], num_classes: int) -> list[tuple[str, nn.Module]]:
    """VGG-16 with BatchNorm for CIFAR-size inputs, in RingSFL's 16 blocks.

    ``conv1..conv13``: ``Conv2d(3x3, padding 1) -> BatchNorm2d -> ReLU``, with
    the 2x2 max pool folded into conv2, conv4, conv7, conv10 and conv13.
    ``fc1``: ``Flatten -> Linear(512*h*w, 512) -> ReLU``; ``fc2``:
    ``Linear(512, 512) -> ReLU``; ``fc3``: ``Linear(512, classes)``. No
    dropout (the common CIFAR classifier; RingSFL's reference code uses the
    ImageNet head ``AdaptiveAvgPool(7x7) -> 4096 -> 4096`` with dropout, which
    is 120M parameters on a 1x1 feature map).

    Inputs whose sides are not multiples of 32 are zero-padded to the next
    multiple by conv1's own padding: on 28x28, conv1 has ``padding=3``, which
    is exactly "pad to 32x32, then a padding-1 conv" (odd differences round
    the padding up; the floor of the pools absorbs the extra row). So 28x28
    and 32x32 both give 512x1x1 after conv13.
    """
    c, h, w = input_shape
    th, tw = -(-h // 32) * 32, -(-w // 32) * 32
    pad1 = (1 + (th - h + 1) // 2, 1 + (tw - w + 1) // 2)
    blocks: list[tuple[str, nn.Module]] = []
    cin = c
    for i, (cout, pool) in enumerate(_VGG16_CONVS, start=1):
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, 3, 1, pad1 if i == 1 else 1),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
        ]
        if pool:
            layers.append(nn.MaxPool2d(2))
        blocks.append((f"conv{i}", nn.Sequential(*layers)))
        cin = cout
    flat = 512 * (th // 32) * (tw // 32)
    blocks += [
        ("fc1", nn.Sequential(nn.Flatten(), nn.Linear(flat, 512), nn.ReLU())),
        ("fc2", nn.Sequential(nn.Linear(512, 512), nn.ReLU())),
        ("fc3", nn.Linear(512, num_classes)),
    ]
    return blocks
