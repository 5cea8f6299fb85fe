"""The AlexNet family: GAS's ``alexnet`` and ``alexnet-gas`` (8 blocks), RingSFL's ``alexnet17`` (17 blocks).

* ``alexnet`` -- an AlexNet with the GAS authors' layer sizes (GAS:
  "Generative Activation-Aided Asynchronous Split Federated Learning"),
  8 blocks ``conv1..conv5, fc1, fc2, fc3``, with a ReLU after every conv and
  hidden linear layer; default cut 2 gives a 64x7x7 activation on 1x28x28
  input and 64x8x8 on 3x32x32. This is **not** the authors' model: theirs is
  ``alexnet-gas``.
* ``alexnet-gas`` -- the GAS authors' AlexNet exactly (``utils/network.py``
  of github.com/eejiarong/GAS: ``AlexNetDown``/``AlexNetUp`` for 1x28x28,
  ``AlexNetDownCifar``/``AlexNetUpCifar`` for 3x32x32, the same layers):
  as ``alexnet`` but with no ReLU after conv3 or conv4 and none between the
  three linear layers. Cut 2 is their split.
* ``alexnet17`` -- RingSFL's MNIST AlexNet, one layer per block (17 blocks,
  as in the authors' code).
"""

from __future__ import annotations

from torch import nn

from fl_app.models.blocks import linear_blocks, out_shape


def alexnet(input_shape: tuple[int, int, int], num_classes: int,
             hidden_relu: bool = True) -> list[tuple[str, nn.Module]]:
    """AlexNet with the GAS authors' layer sizes: 5 conv blocks + 3 fc blocks (8 blocks).

    ``hidden_relu=False`` is the authors' model (``alexnet-gas``): no ReLU
    after conv3 or conv4, none after fc1 or fc2. The parameters' names are
    the same either way (a ReLU holds none).
    """
    c = input_shape[0]

    def act(*layers: nn.Module) -> nn.Sequential:
        return nn.Sequential(*layers, nn.ReLU()) if hidden_relu else nn.Sequential(*layers)

    convs: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Sequential(nn.Conv2d(c, 32, 3, 1, 1), nn.MaxPool2d(2), nn.ReLU())),
        ("conv2", nn.Sequential(nn.Conv2d(32, 64, 3, 1, 1), nn.MaxPool2d(2), nn.ReLU())),
        ("conv3", act(nn.Conv2d(64, 128, 3, 1, 1))),
        ("conv4", act(nn.Conv2d(128, 256, 3, 1, 1))),
        ("conv5", nn.Sequential(nn.Conv2d(256, 256, 3, 1, 1), nn.MaxPool2d(3, 2), nn.ReLU())),
    ]
    feat = out_shape([m for _, m in convs], input_shape, "alexnet" if hidden_relu else "alexnet-gas")
    flat = feat[0] * feat[1] * feat[2]
    fcs: list[tuple[str, nn.Module]] = [
        ("fc1", act(nn.Flatten(), nn.Linear(flat, 1024))),
        ("fc2", act(nn.Linear(1024, 512))),
        ("fc3", nn.Linear(512, num_classes)),
    ]
    return convs + fcs


def alexnet_gas(input_shape: tuple[int, int, int], num_classes: int) -> list[tuple[str, nn.Module]]:
    """The GAS authors' AlexNet (``AlexNetDown``/``AlexNetUp``, and their CIFAR twins): :func:`alexnet`
    without the hidden ReLUs after conv3, conv4, fc1 and fc2."""
    return alexnet(input_shape, num_classes, hidden_relu=False)


def alexnet17(input_shape: tuple[int, int, int], num_classes: int) -> list[tuple[str, nn.Module]]:
    """RingSFL's AlexNet for MNIST, one layer per block (17 blocks).

    The paper only says "AlexNet is divided into 17 blocks". The authors'
    code (GitHub ``ShenJinglong/DistRingSFL``, ``model/AlexNet.py``,
    ``AlexNet_Mnist``) lists exactly 17 layers, reproduced here::

        conv1 Conv2d(C, 32, 3, padding 1)   pool1 MaxPool2d(2)   relu1
        conv2 Conv2d(32, 64, 3, padding 1)  pool2 MaxPool2d(2)   relu2
        conv3 Conv2d(64, 128, 3, padding 1)
        conv4 Conv2d(128, 256, 3, padding 1)
        conv5 Conv2d(256, 256, 3, padding 1) pool3 MaxPool2d(2)  relu3
        flatten  fc1 Linear(256*h*w, 1024)  relu4
        fc2 Linear(1024, 512)  relu5  fc3 Linear(512, classes)

    It is the GAS AlexNet (``alexnet``) without the ReLUs after conv3 and
    conv4 (as in that code) and with a 2x2 last pool. 28x28 gives a 256x3x3
    feature map (2304 features), 32x32 gives 256x4x4 (4096).
    """
    c = input_shape[0]
    front: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Conv2d(c, 32, 3, 1, 1)),
        ("pool1", nn.MaxPool2d(2)),
        ("relu1", nn.ReLU()),
        ("conv2", nn.Conv2d(32, 64, 3, 1, 1)),
        ("pool2", nn.MaxPool2d(2)),
        ("relu2", nn.ReLU()),
        ("conv3", nn.Conv2d(64, 128, 3, 1, 1)),
        ("conv4", nn.Conv2d(128, 256, 3, 1, 1)),
        ("conv5", nn.Conv2d(256, 256, 3, 1, 1)),
        ("pool3", nn.MaxPool2d(2)),
        ("relu3", nn.ReLU()),
        ("flatten", nn.Flatten()),
    ]
    (flat,) = out_shape([m for _, m in front], input_shape, "alexnet17")
    return front + linear_blocks(flat, (1024, 512), num_classes, first_relu=4)
