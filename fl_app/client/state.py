"""The ClientApp's state: the layout of a node's ``context.state`` and its keys.

All per-node state lives in ``context.state`` (a RecordDict), never in
Python objects, because Flower may run a node's next message in another
process. A node holds its data sampler and any number of named **model
slots** (:data:`fl_app.protocol.OWN_SLOT` for its own client-side model,
``relay:<origin>`` for a segment it trains for another client;
:mod:`fl_app.client.slots`):

=========================  ======  ===========================================
``task``                   Config  the run configuration from the handshake
``node.identity``          Config  ``partition-id`` the server assigned in the
                                   handshake (a node with its own data and no
                                   ``partition-id`` in its node_config)
``data.sampler``           Config  ``epoch``, ``pos``, ``step`` of the sampler
``slot.<name>.weights``    Array   the slot's weights (absent: the seeded
                                   initial weights of its blocks)
``slot.<name>.optimizer``  Array   SGD momentum buffers of the slot (a
                                   ``train.backward`` carrying
                                   :data:`~fl_app.protocol.OPTIMIZER`
                                   replaces them and returns the new ones)
``slot.<name>.accum``      Array   accumulated weighted parameter gradients
``slot.<name>.batch``      Config  ``start``, ``end`` of the slot's range;
                                   for own data ``indices`` and ``step`` of
                                   the batch last forwarded; ``rng-seed``,
                                   the dropout seed of the last forward
                                   (absent: the model draws no random
                                   numbers);
                                   ``zo-seeds``, the ZO direction seeds
``rng``                    Config  ``forwards``: training forward passes so
                                   far (draws the dropout seeds)
``slot.<name>.input``      Array   a relayed input ``x`` (and labels ``y``)
                                   of the slot's last forward
=========================  ======  ===========================================

Where a node's ``context.state`` is the same object from one message to the
next (the in-process engine), the node also keeps its live models and the
autograd graphs of its forward passes, only as a cache of what the state
holds (:mod:`fl_app.client.live`). Nothing changes numerically; under Ray and in
deployment nothing is kept.
"""

from __future__ import annotations

#: ConfigRecord of the node's data sampler (``epoch``, ``pos``, ``step``).
SAMPLER_KEY = "data.sampler"
#: Key of the ZO direction seeds in a slot's batch record.
ZO_SEEDS = "zo-seeds"
#: ConfigRecord of the node's forward-pass counter (``forwards``), which seeds dropout.
RNG_KEY = "rng"
#: Key of the dropout seed of a slot's last forward in its batch record.
RNG_SEED = "rng-seed"
#: Seed-stream tag of the dropout seeds of the client's forward passes.
STREAM_DROPOUT = 29
#: ConfigRecord of the node state holding (``partition-id``) the id the server assigned at the handshake.
IDENTITY_KEY = "node.identity"
#: ConfigRecord of a node without a task (a vertical party, :mod:`fl_app.vertical.party`): ``run-dir`` and
#: ``partition-id``, where its checkpoint key lives and the partition its sealed state is bound to
#: (:mod:`fl_app.client.checkpoint`).
CHECKPOINT_IDENTITY = "checkpoint.identity"
#: The parts of a slot that make up its model (another slot's when it names a ``model_slot``).
MODEL_PARTS = ("weights", "optimizer", "accum")


def slot_key(slot: str, part: str) -> str:
    """The ``context.state`` key of a slot's record ``part``.

    ``part`` is ``weights``, ``optimizer``, ``accum``, ``batch`` or ``input``.
    """
    return f"slot.{slot}.{part}"
