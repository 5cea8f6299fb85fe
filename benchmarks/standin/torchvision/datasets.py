"""Stand-ins for ``torchvision.datasets.FashionMNIST`` (``GAS_main.py`` with ``fmnist = True``) and ``MNIST``
(the RingSFL authors' ``utils/data_utils.py``).

File lookup (first hit wins), for each of the four standard IDX names, plain or .gz:
  1. $TV_FASHIONMNIST_DIR (FashionMNIST) or $TV_MNIST_DIR (MNIST)/<name>[.gz]   (a directory holding the files)
  2. <root>/FashionMNIST/raw/<name>[.gz] or <root>/MNIST/raw/...               (torchvision's own layout)
download=True is accepted but never downloads; missing files raise RuntimeError like torchvision.
"""
import os

import torch
from PIL import Image

__all__ = ["FashionMNIST", "MNIST"]


def _read_idx(path):
    """One IDX file as a uint8 tensor, through sflower's own checked reader (``fl_app.data.files``; the
    repository is last on the authors' code's ``PYTHONPATH``): images have magic 2051, labels 2049."""
    from pathlib import Path

    from fl_app.data.files import read_idx as read_checked

    magic = 2051 if "images" in os.path.basename(path) else 2049
    return torch.from_numpy(read_checked(Path(path), magic).copy())


class FashionMNIST(torch.utils.data.Dataset):
    """torchvision's ``FashionMNIST``: ``data`` (uint8, N x 28 x 28), ``targets`` (int64, N); an item is
    ``(transform(PIL image), int label)``.

    Raises:
        RuntimeError: an IDX file is in neither place of the module docstring (it never downloads).
    """

    _env = "TV_FASHIONMNIST_DIR"
    classes = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
               "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
    _files = {True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
              False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}

    def __init__(self, root, train=True, transform=None, target_transform=None, download=False):
        if isinstance(root, (str, bytes)):
            root = os.path.expanduser(root)
        self.root = root
        self.train = train
        self.transform = transform
        self.target_transform = target_transform
        img_name, lbl_name = self._files[bool(train)]
        self.data = _read_idx(self._find(img_name))            # uint8, N x 28 x 28
        self.targets = _read_idx(self._find(lbl_name)).long()  # int64, N

    @property
    def raw_folder(self):
        return os.path.join(self.root, self.__class__.__name__, "raw")

    def _find(self, name):
        dirs = []
        env = os.environ.get(self._env)
        if env:
            dirs.append(env)
        dirs.append(self.raw_folder)
        for d in dirs:
            for cand in (name, name + ".gz"):
                p = os.path.join(d, cand)
                if os.path.isfile(p):
                    return p
        raise RuntimeError(f"Dataset not found: {name}[.gz] in {dirs} "
                           f"(torchvision stand-in never downloads; set {self._env} or root)")

    def __getitem__(self, index):
        img, target = self.data[index], int(self.targets[index])
        img = Image.fromarray(img.numpy(), mode="L")
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    def __len__(self):
        return len(self.data)

    def extra_repr(self):
        return f"Split: {'Train' if self.train is True else 'Test'}"


class MNIST(FashionMNIST):
    """torchvision's ``MNIST``: as :class:`FashionMNIST`, from ``$TV_MNIST_DIR`` or ``<root>/MNIST/raw``."""

    _env = "TV_MNIST_DIR"
    classes = [f"{d} - {name}" for d, name in enumerate(
        ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"))]
