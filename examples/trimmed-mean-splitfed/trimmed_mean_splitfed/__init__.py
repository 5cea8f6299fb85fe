"""SplitFed-V1 whose client-side models (and per-client server-side copies) are combined by a
coordinate-wise trimmed mean (Yin et al. 2018, "Byzantine-robust distributed learning", Def. 2).

The whole plugin: one class, one option, one hook (``aggregate_models``).
"""

from __future__ import annotations

import torch

from fl_app.run.options import Option
from strategies.algorithms.splitfed import SplitFedV1


class TrimmedMeanSplitFed(SplitFedV1):
    """SplitFed-V1 with a coordinate-wise trimmed mean instead of the sample-weighted mean."""

    name = "splitfed-trimmed-mean"
    options = (Option("trim-fraction", 0.1, "fraction β of the models dropped at each end, per coordinate",
                      at_least=0.0, at_most=0.49, source="Yin et al. 2018, Def. 2"),)

    def aggregate_models(self, models, weights):
        """Per coordinate: sort the K values, drop ⌊βK⌋ at each end, average the rest (weights unused)."""
        cut = int(self.cfg.get("trim-fraction") * len(models))
        out = {}
        for key, first in models[0].items():
            if not first.is_floating_point():
                out[key] = first.clone()
                continue
            values = torch.stack([m[key] for m in models]).sort(dim=0).values
            out[key] = values[cut:len(models) - cut].mean(dim=0)
        return out
