"""Model inversion of activations: a decoder trained on auxiliary data, a shadow client model, the scores.

The attack of He, Zhang and Lee, "Model inversion attacks against
collaborative inference", ACSAC 2019 (§4.2, the black-box "inverse network";
§4.3, the query-free attack with a shadow model), as SLPerf (Zhou et al.
2023) runs it against split learning: the server trains a decoder
``g: activations -> inputs`` on auxiliary data it holds, through a
client-side model ``f`` (:func:`train_decoder`, minimising
``||g(f(x)) - x||²``), then applies ``g`` to the activations it received.

``f`` is the client-side model where the strategy uploads it; otherwise a
shadow model the server trains itself (:func:`train_shadow`): the run's
initial client-side weights (every party builds them from the run's seed),
trained on the auxiliary data through the server's own, frozen server-side
model to minimise the cross-entropy, so that its activations land where the
server-side model reads them.

Scores (:func:`scores`): MSE, PSNR and SSIM of the reconstructions against
the originals, both mapped back to pixels in ``[0, 1]`` (torchmetrics,
``data_range=1``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fl_app.privacy.activations import clip_rows

#: Auxiliary examples per decoder/shadow training step.
BATCH = 64


class Decoder(nn.Module):
    """An inverse network from activations ``[B, *act_shape]`` to inputs ``[B, C, H, W]``.

    Feature maps (``act_shape`` ``(C', H', W')``): conv 3×3 to 32 channels, bilinear resize to
    ``(H, W)``, two conv 3×3 (16, then ``C``). Vectors (``(D,)``): a linear layer to
    ``32 × ⌈H/4⌉ × ⌈W/4⌉``, then the same resize and convs. ReLU between layers. Small on purpose: a
    sweep attacks every run on one CPU thread.
    """

    def __init__(self, act_shape: tuple[int, ...], input_shape: tuple[int, int, int]) -> None:  # noqa: D107
        super().__init__()
        c, h, w = input_shape
        self.flat = len(act_shape) != 3
        if self.flat:
            self.seed_shape = (32, -(-h // 4), -(-w // 4))
            self.head: nn.Module = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(act_shape)),
                                                                         int(np.prod(self.seed_shape))), nn.ReLU())
        else:
            self.head = nn.Sequential(nn.Conv2d(act_shape[0], 32, 3, padding=1), nn.ReLU())
        self.body = nn.Sequential(nn.Upsample(size=(h, w), mode="bilinear", align_corners=False),
                                  nn.Conv2d(32, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, c, 3, padding=1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Reconstructions ``[B, C, H, W]`` (in the normalised input space) of activations ``z``."""
        out = self.head(z)
        if self.flat:
            out = out.view(z.shape[0], *self.seed_shape)
        return self.body(out)


def _batches(n: int, epochs: int, gen: torch.Generator):
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen)
        for i in range(0, n, BATCH):
            yield order[i:i + BATCH]


def train_shadow(shadow: nn.Module, server: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int,
                 gen: torch.Generator, lr: float = 1e-3, tail: nn.Module | None = None) -> nn.Module:
    """Train ``shadow`` (a client-side model) so that ``server(shadow(x))`` classifies the auxiliary data,
    the server-side model frozen (Adam, ``lr``, ``epochs`` passes over ``x`` ``[N, C, H, W]``, ``y`` ``[N]``,
    shuffled by ``gen``). Returns ``shadow`` in eval mode.

    In a U-shaped split the server holds only the middle; ``tail`` is then the attacker's own shadow of the
    clients' tail, trained with ``shadow``: ``tail(server(shadow(x)))``."""
    server.eval()
    for p in server.parameters():
        p.requires_grad_(False)
    trained = nn.ModuleList([shadow] if tail is None else [shadow, tail]).train()
    opt = torch.optim.Adam(trained.parameters(), lr=lr)
    for idx in _batches(len(x), epochs, gen):
        opt.zero_grad()
        out = server(shadow(x[idx]))
        out = out if tail is None else tail(out)
        nn.functional.cross_entropy(out, y[idx]).backward()
        opt.step()
    return shadow.eval()


def train_decoder(client: nn.Module, x: torch.Tensor, epochs: int, gen: torch.Generator,
                  clip: float = 0.0, noise_std: float = 0.0, lr: float = 1e-3) -> Decoder:
    """Train a :class:`Decoder` on ``(client(x), x)``, ``x`` the auxiliary inputs ``[N, C, H, W]``
    (normalised), ``client`` frozen (Adam, ``lr``, MSE, ``epochs`` passes shuffled by ``gen``).

    A defence-aware attacker (the run's ``act-clip`` and ``act-noise`` are in its configuration): with
    ``clip`` > 0 the activations are clipped per sample to that L2 norm
    (:func:`fl_app.privacy.activations.clip_rows`), and each training batch gets fresh ``N(0, noise_std²)`` noise
    (from ``gen``), so that the decoder learns to invert what the defence releases."""
    client.eval()
    with torch.no_grad():
        z = client(x)
        if clip > 0:
            z = clip_rows(z, clip)
    dec = Decoder(tuple(z.shape[1:]), tuple(x.shape[1:]))
    opt = torch.optim.Adam(dec.parameters(), lr=lr)
    for idx in _batches(len(x), epochs, gen):
        zb = z[idx]
        if noise_std > 0:
            zb = zb + noise_std * torch.randn(tuple(zb.shape), generator=gen)
        opt.zero_grad()
        nn.functional.mse_loss(dec(zb), x[idx]).backward()
        opt.step()
    return dec.eval()


def to_pixels(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """Normalised inputs ``[B, C, H, W]`` back to pixels in ``[0, 1]`` (``x·std + mean``, clamped)."""
    c = x.shape[1]
    m = torch.tensor(mean, dtype=x.dtype).view(1, c, 1, 1)
    s = torch.tensor(std, dtype=x.dtype).view(1, c, 1, 1)
    return (x * s + m).clamp(0.0, 1.0)


def scores(recon: torch.Tensor, orig: torch.Tensor) -> dict[str, float]:
    """``{"mse", "psnr", "ssim"}`` of reconstructions against originals, both pixels in ``[0, 1]``
    ``[B, C, H, W]``: the mean squared error, and torchmetrics' PSNR (dB) and SSIM (Gaussian 11×11, σ 1.5)
    over the whole batch, ``data_range=1``."""
    from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

    recon, orig = recon.double(), orig.double()
    return {
        "mse": float(nn.functional.mse_loss(recon, orig)),
        "psnr": float(peak_signal_noise_ratio(recon, orig, data_range=1.0)),
        "ssim": float(structural_similarity_index_measure(recon, orig, data_range=1.0)),
    }


def save_grid(orig: torch.Tensor, recon: torch.Tensor, path: str, columns: int = 16) -> None:
    """A PNG of originals (odd rows) above their reconstructions (even rows), pixels ``[B, C, H, W]`` in
    ``[0, 1]``, ``columns`` images per row, 2-pixel white gaps (Pillow)."""
    from PIL import Image

    n = min(len(orig), columns * 4)
    b, c, h, w = orig[:n].shape
    rows = -(-n // columns)
    canvas = np.ones((rows * 2 * (h + 2), columns * (w + 2), c), dtype=np.float32)
    for i in range(n):
        r, col = divmod(i, columns)
        for k, img in enumerate((orig[i], recon[i])):
            y0, x0 = (2 * r + k) * (h + 2), col * (w + 2)
            canvas[y0:y0 + h, x0:x0 + w] = img.permute(1, 2, 0).cpu().numpy()
    data = (canvas * 255).round().astype(np.uint8)
    Image.fromarray(data[..., 0] if c == 1 else data).save(path)
