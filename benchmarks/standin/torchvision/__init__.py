"""A stand-in for the few torchvision symbols that the GAS and RingSFL authors' code uses on (Fashion-)MNIST.

torchvision does not import beside torch 2.13's CPU wheel, so :mod:`benchmarks.authors` puts this package
(``benchmarks/standin``) first on the authors' code's ``PYTHONPATH``. It implements only
``datasets.FashionMNIST`` and ``MNIST``, ``transforms.Compose``, ``ToTensor`` and ``Normalize``, each doing
torchvision's per-sample work (a PIL image, then ``ToTensor``, then ``Normalize``), and never downloads. It
is sflower's code, not the authors'; nothing in sflower imports it.
"""
from . import datasets, transforms  # noqa: F401  (GAS_main.py: `torchvision.datasets.FashionMNIST`)

__version__ = "0.0-standin"
