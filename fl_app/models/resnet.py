"""CIFAR-style ResNet-18 (He et al. 2016) in RingSFL's 10 blocks (``resnet18``).

Blocks ``stem, layer1_0 .. layer4_1, head``. GAS's cut "after the first
residual layer" (stage 1) is ``cut-layer=3``.
"""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    """ResNet basic block (He et al. 2016): two 3x3 conv+BN, identity or 1x1-conv shortcut.

    ``(N, in_channels, H, W) -> (N, out_channels, ceil(H/stride), ceil(W/stride))``:
    ``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``. The shortcut is
    ``Conv2d(1x1, stride) -> BatchNorm2d`` when the stride or the channel
    count changes, else the identity (an empty ``nn.Sequential``).

    Args:
        in_channels: input channels.
        out_channels: output channels.
        stride: stride of conv1 and of the shortcut (1 or 2).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, C_in, H, W) -> (N, C_out, H', W')`` (see the class docstring)."""
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


def resnet18(input_shape: tuple[int, int, int], num_classes: int) -> list[tuple[str, nn.Module]]:
    """CIFAR-style ResNet-18 in RingSFL's 10 blocks.

    ``stem``: ``Conv2d(C, 64, 3x3, padding 1, no bias) -> BatchNorm2d -> ReLU``
    (no max pool); ``layer1_0 .. layer4_1``: the 8 :class:`BasicBlock` s of
    the four stages (64, 128, 256, 512 channels; the first block of stages
    2-4 has stride 2); ``head``: ``AdaptiveAvgPool2d(1) -> Flatten ->
    Linear(512, classes)``. 32x32 gives 32, 16, 8, 4 pixel stages; 28x28
    gives 28, 14, 7, 4. The adaptive pool equals RingSFL's ``AvgPool2d(4)``
    on the 4x4 map of both.
    """
    c = input_shape[0]
    blocks: list[tuple[str, nn.Module]] = [
        ("stem", nn.Sequential(nn.Conv2d(c, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())),
    ]
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512), start=1):
        for j in range(2):
            stride = 2 if stage > 1 and j == 0 else 1
            blocks.append((f"layer{stage}_{j}", BasicBlock(cin, cout, stride)))
            cin = cout
    blocks.append(("head", nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes))))
    return blocks
