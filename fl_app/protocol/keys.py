"""Message actions, record keys and their values: the names the client message protocol is spelt with.

Strategies compose a small, fixed set of actions; each is a Flower message
type ``"<category>.<action>"`` routed by the ClientApp
(:mod:`fl_app.client_app`). Record keys used in message content (a
:class:`flwr.app.RecordDict`):

=================  ==========  ==============================================
key                kind        meaning
=================  ==========  ==============================================
``task``           Config      the run configuration (handshake only)
``config``         Config      per-message settings: one of the typed
                               ``*Config`` classes of :mod:`.configs`
``weights``        Array       model weights (a torch ``state_dict``)
``activations``    Array       one tensor ``"x"``: float32 ``[B, ...]``; the
                               input of a forward on a block range that does
                               not start at 0, or the output of a forward
``labels``         Array       one tensor ``"y"``: int64 ``[B]``
``gradient``       Array       one tensor ``"g"``: float32, shape of the
                               activations it answers (a backward's input),
                               or the gradient w.r.t. a range's input (reply)
``perturbed``      Array       ``"plus"``, ``"minus"``: float32 ``[P, B, ...]``
                               embeddings at ``w ± μ u_p`` (``train.zo_forward``)
``info``           Config      handshake reply / example counts / metrics
                               (keys ``INFO_*``)
``optimizer``      Array       an optimizer state the server holds for its
                               clients (see :data:`OPTIMIZER`)
=================  ==========  ==============================================

Every training action names a **block range** ``[start, end)`` of the model
and a **model slot** on the node (:data:`OWN_SLOT`, the node's own client-side
model, or ``relay_slot(origin)`` for a segment it trains for another client).
"""

from __future__ import annotations

# --- actions (message types) -------------------------------------------------
QUERY_INFO = "query.info"
TRAIN_FORWARD = "train.forward"
TRAIN_BACKWARD = "train.backward"
TRAIN_STEP = "train.step"
TRAIN_FIT = "train.fit"
TRAIN_ZO_FORWARD = "train.zo_forward"
TRAIN_ZO_UPDATE = "train.zo_update"
EVALUATE = "evaluate"
#: The node's whole ``context.state`` as the reply's records, for a checkpoint (:mod:`fl_app.client.checkpoint`).
QUERY_CHECKPOINT = "query.checkpoint"
#: Replace the node's whole ``context.state`` with the request's records (a resume); the reply is an ``info`` ack.
QUERY_RESTORE = "query.restore"

ACTIONS = (QUERY_INFO, TRAIN_FORWARD, TRAIN_BACKWARD, TRAIN_STEP, TRAIN_FIT, TRAIN_ZO_FORWARD, TRAIN_ZO_UPDATE,
           EVALUATE, QUERY_CHECKPOINT, QUERY_RESTORE)

# --- record keys ---------------------------------------------------------------
TASK = "task"
CONFIG = "config"
WEIGHTS = "weights"
ACTIVATIONS = "activations"
LABELS = "labels"
GRADIENT = "gradient"
PERTURBED = "perturbed"
INFO = "info"
#: An optimizer state the server holds for its clients (SGD momentum buffers keyed by parameter
#: name, as ``slot.<name>.optimizer``): sent with a ``train.backward``, it replaces the slot's before
#: the step, and the reply returns the slot's new state under the same key (GAS's shared client
#: optimizer, ``client-momentum=shared``). An empty record means "no state yet".
OPTIMIZER = "optimizer"

# --- keys of the "info" ConfigRecord in replies ----------------------------------
INFO_PARTITION_ID = "partition-id"
INFO_NUM_EXAMPLES = "num-examples"
INFO_LABEL_HISTOGRAM = "label-histogram"
INFO_LOSS = "loss"
INFO_ACCURACY = "accuracy"
INFO_TRAIN_LOSS = "train-loss"
INFO_OK = "ok"  # an acknowledgement with nothing else to return

# --- values of BackwardConfig.next --------------------------------------------
NEXT_FORWARD = "forward"  # piggyback the next forward pass
NEXT_WEIGHTS = "weights"  # the local round is over: return the slot's weights
NEXT_NONE = "none"
NEXT_VALUES = (NEXT_FORWARD, NEXT_WEIGHTS, NEXT_NONE)

# --- values of EvaluateConfig.split --------------------------------------------
SPLIT_TEST = "test"
SPLIT_LOCAL = "local"

#: The node's own client-side model.
OWN_SLOT = "own"
#: The slot of a node's tail in a label-private (U-shaped) split: blocks ``[c2, L)``, the loss and the labels.
TAIL_SLOT = "tail"


def relay_slot(origin: int) -> str:
    """Name of the slot in which a node trains a segment for client ``origin`` (RingSFL)."""
    return f"relay:{int(origin)}"

