"""Stand-in for the torchvision.transforms symbols used by GAS: Compose, ToTensor, Normalize.

Same per-sample work as torchvision (v0.12 .. current) on a PIL image / float tensor.
"""
import numpy as np
import torch
from PIL import Image

__all__ = ["Compose", "ToTensor", "Normalize"]


class Compose:
    """torchvision's ``Compose``: the transforms in order."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img

    def __repr__(self):
        return self.__class__.__name__ + "(" + "".join("\n    " + repr(t) for t in self.transforms) + "\n)"


_MODE_TO_NPTYPE = {"I": np.int32, "I;16": np.int16, "F": np.float32}


def to_tensor(pic):
    """torchvision.transforms.functional.to_tensor for PIL images (the authors' code gives it no other input),
    with torchvision's steps, so that it costs what torchvision's does.

    Raises:
        TypeError: ``pic`` is not a PIL image.
    """
    default_float_dtype = torch.get_default_dtype()
    if not isinstance(pic, Image.Image):
        raise TypeError(f"pic should be PIL Image. Got {type(pic)}")
    # PIL image: uint8 array -> tensor viewed H x W x C -> C x H x W, contiguous, float / 255
    img = torch.from_numpy(np.array(pic, _MODE_TO_NPTYPE.get(pic.mode, np.uint8), copy=True))
    if pic.mode == "1":
        img = 255 * img
    img = img.view(pic.size[1], pic.size[0], len(pic.getbands()))
    img = img.permute((2, 0, 1)).contiguous()
    if isinstance(img, torch.ByteTensor):
        return img.to(dtype=default_float_dtype).div(255)
    return img


class ToTensor:
    """torchvision's ``ToTensor``: :func:`to_tensor` (a C x H x W float tensor in [0, 1])."""

    def __call__(self, pic):
        return to_tensor(pic)

    def __repr__(self):
        return self.__class__.__name__ + "()"


def normalize(tensor, mean, std, inplace=False):
    """torchvision.transforms.functional.normalize for float tensors (C x H x W or B x C x H x W)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"img should be Tensor Image. Got {type(tensor)}")
    if not tensor.is_floating_point():
        raise TypeError(f"Input tensor should be a float tensor. Got {tensor.dtype}.")
    if tensor.ndim < 3:
        raise ValueError(f"Expected tensor to be a tensor image of size (..., C, H, W). Got {tuple(tensor.size())}.")
    if not inplace:
        tensor = tensor.clone()
    dtype = tensor.dtype
    mean = torch.as_tensor(mean, dtype=dtype, device=tensor.device)
    std = torch.as_tensor(std, dtype=dtype, device=tensor.device)
    if (std == 0).any():
        raise ValueError(f"std evaluated to zero after conversion to {dtype}, leading to division by zero.")
    if mean.ndim == 1:
        mean = mean.view(-1, 1, 1)
    if std.ndim == 1:
        std = std.view(-1, 1, 1)
    return tensor.sub_(mean).div_(std)


class Normalize:
    """torchvision's ``Normalize``: :func:`normalize`, ``(x - mean) / std`` per channel."""

    def __init__(self, mean, std, inplace=False):
        self.mean = mean
        self.std = std
        self.inplace = inplace

    def __call__(self, tensor):
        return normalize(tensor, self.mean, self.std, self.inplace)

    def __repr__(self):
        return f"{self.__class__.__name__}(mean={self.mean}, std={self.std})"
