"""Which strategies run on a text model (``model=minilm-l6``), and one-line refusals for the others.

A text activation is ``(N, T, 385)``: hidden states plus the attention mask
as one feature, ``T`` the batch's longest sentence (``text-padding=batch``)
or 64 (``text-padding=max``). The split strategies that treat each client's
activations on their own (SplitFed-V1/V2, vanilla SL) and FedAvg run as
they are. The ones that stack or average activations or activation gradients
across clients (MiniBatch-SFL, PSL, EPSL) need one shape for all
(``text-padding=max``). The rest refuse
(:data:`TEXT_REFUSALS`), each with its reason.

Imports: ``fl_app`` and ``strategies``; nothing from ``simulation`` or ``benchmarks``.
"""

from __future__ import annotations

from fl_app.run.config import RunConfig
from fl_app.run.errors import ConfigError
from fl_app.models import TEXT_MODELS

#: Strategy -> why it does not run on a text model (one line each).
TEXT_REFUSALS: dict[str, str] = {
    "gas": "its per-label Gaussians model a flat activation vector of one fixed size, and a text activation is "
           "(tokens x 385) with a length that varies by batch and a 0/1 mask feature that a Gaussian sample "
           "would corrupt; it would need statistics of the pooled sentence vector (or per position, per length "
           "bucket) and generated masks",
    "gapsl": "its gradient alignment compares every selected client's activation gradient element-wise, "
             "per token position, which mixes sentences of different lengths and padding; it would need the "
             "alignment on pooled (masked-mean) gradients",
    "ringsfl": "its propagation lengths split the blocks by the FLOPs of a fixed input shape, while text "
               "batches vary in length and the embedding block has nothing to train; it has not been adapted "
               "or tested on text",
    "s2fl": "its activation grouping concatenates activations of different clients, which have different "
            "lengths and masks; not adapted to text yet",
}

#: Strategies that stack or average clients' activations or gradients: they need one length (``text-padding=max``).
NEEDS_FIXED_LENGTH = ("minibatch-sfl", "psl", "epsl")


def check_text(name: str, cfg: RunConfig) -> None:
    """Refuse a strategy that cannot run on a text model, in one line with its reason.

    Args:
        name: the strategy's registered name.
        cfg: the run configuration (``model``, ``text-padding``, ``client-optimizer``).

    Raises:
        ConfigError: ``model`` is a text model and the strategy is in :data:`TEXT_REFUSALS`, or is in
            :data:`NEEDS_FIXED_LENGTH` without ``text-padding=max``, or ``compress-up=topk`` (it would drop
            mask entries; fp16 and int8 keep the 0/1 mask exact, as it is read as ``> 0.5``).
    """
    if cfg.get("model") not in TEXT_MODELS:
        return
    reason = TEXT_REFUSALS.get(name)
    if reason is not None:
        raise ConfigError(f"strategy {name} does not run on model={cfg.get('model')}: {reason}")
    if cfg.get("compress-up") == "topk":
        raise ConfigError("compress-up=topk on a text model would drop entries of the attention mask that travels "
                          "with the activations; use fp16 or int8, which keep it exact")
    if name in NEEDS_FIXED_LENGTH and cfg.get("text-padding") != "max":
        raise ConfigError(f"strategy {name} stacks or averages the clients' activations, which needs one length "
                          f"for all: add text-padding=max")
