"""Hugging Face hub fallback: a quick connectivity probe, then ``datasets``.

The hub is only tried after a short TCP probe of ``huggingface.co:443`` (so an
offline machine fails within seconds), and never when ``HF_HUB_OFFLINE``,
``HF_DATASETS_OFFLINE`` or ``SFLOWER_NO_HUB`` is set.
"""

from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np

from fl_app.data.dataset import ImageDataset, _make

_HUB_IDS = {
    "mnist": "ylecun/mnist",
    "fashion-mnist": "zalando-datasets/fashion_mnist",
    "cifar10": "uoft-cs/cifar10",
    "cifar100": "uoft-cs/cifar100",
}

_HUB_HOST = ("huggingface.co", 443)
_HUB_PROBE_TIMEOUT_S = 3.0
_hub_probe_cache: dict[str, tuple[float, bool]] = {}


def _hub_disabled() -> bool:
    return any(
        os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "SFLOWER_NO_HUB")
    )


def _hub_reachable(timeout: float = _HUB_PROBE_TIMEOUT_S) -> bool:
    """True when a TCP connection to huggingface.co:443 opens within ``timeout``.

    Name resolution and connect run in a daemon thread so that a hanging DNS
    lookup cannot block longer than ``timeout``. A result is remembered for 60 s.
    """
    if _hub_disabled():
        return False
    cached = _hub_probe_cache.get("hub")
    if cached is not None and time.monotonic() - cached[0] < 60.0:
        return cached[1]
    result = [False]

    def probe() -> None:
        try:
            with socket.create_connection(_HUB_HOST, timeout=timeout):
                result[0] = True
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    ok = result[0] and not t.is_alive()
    _hub_probe_cache["hub"] = (time.monotonic(), ok)
    return ok


def _load_from_hub(name: str) -> ImageDataset | None:
    """Try the Hugging Face hub; None on any failure (offline, missing, ...)."""
    if not _hub_reachable():
        return None
    try:
        import datasets as hf

        dd = hf.load_dataset(_HUB_IDS[name])
        splits = []
        for split in ("train", "test"):
            ds = dd[split]
            img_col = "img" if "img" in ds.column_names else "image"
            lab_col = "fine_label" if "fine_label" in ds.column_names else "label"
            imgs = np.stack([np.asarray(im, dtype=np.uint8) for im in ds[img_col]])
            if imgs.ndim == 3:  # [N, H, W] greyscale
                imgs = imgs[:, None]
            else:  # [N, H, W, C]
                imgs = imgs.transpose(0, 3, 1, 2)
            splits.append((imgs, np.asarray(ds[lab_col], dtype=np.int64)))
        return _make(name, splits[0][0], splits[0][1], splits[1][0], splits[1][1])
    except Exception:  # noqa: BLE001 - any hub failure falls back to the local error
        return None
