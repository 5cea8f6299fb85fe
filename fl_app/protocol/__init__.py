"""The client message protocol: actions and record keys, typed configs, the array codec, records,
request builders and reply readers.

docs/explanation/design.md §4. One home per message action:

* :mod:`.keys`: the actions (message types), record keys and their values;
* :mod:`.configs`: the typed per-action configs (the ``config`` record);
* :mod:`.codec`: tensors as :class:`~flwr.app.Array` bytes;
* :mod:`.records`: tensors and state dicts in records, copy-free access;
* :mod:`.requests`: builders of every request's content, from typed configs;
* :mod:`.replies`: readers of every reply, and what a reply must hold.

Everything public is re-exported here: ``from fl_app import protocol as P``.

Imports: ``fl_app`` only (the bottom floor); nothing from ``strategies``, ``simulation`` or ``benchmarks``.
"""

from fl_app.protocol.codec import DeferredArray, canonical, record_view, tensor_array, value_token
from fl_app.protocol.configs import (
    ActionConfig,
    BackwardConfig,
    EvaluateConfig,
    FitConfig,
    ForwardConfig,
    ForwardPlan,
    OptimizerConfig,
    StepConfig,
    ZOForwardConfig,
    ZOUpdateConfig,
    range_end,
)
from fl_app.protocol.keys import (
    ACTIONS,
    ACTIVATIONS,
    CONFIG,
    EVALUATE,
    GRADIENT,
    INFO,
    INFO_ACCURACY,
    INFO_LABEL_HISTOGRAM,
    INFO_LOSS,
    INFO_NUM_EXAMPLES,
    INFO_OK,
    INFO_PARTITION_ID,
    INFO_TRAIN_LOSS,
    LABELS,
    NEXT_FORWARD,
    NEXT_NONE,
    NEXT_VALUES,
    NEXT_WEIGHTS,
    OPTIMIZER,
    OWN_SLOT,
    TAIL_SLOT,
    PERTURBED,
    QUERY_CHECKPOINT,
    QUERY_INFO,
    QUERY_RESTORE,
    SPLIT_LOCAL,
    SPLIT_TEST,
    TASK,
    TRAIN_BACKWARD,
    TRAIN_FIT,
    TRAIN_FORWARD,
    TRAIN_STEP,
    TRAIN_ZO_FORWARD,
    TRAIN_ZO_UPDATE,
    WEIGHTS,
    relay_slot,
)
from fl_app.protocol.records import (
    array_of,
    array_record,
    array_records,
    config_of,
    config_records,
    get_array,
    get_config,
    record_bytes,
    record_dict,
    record_state,
    record_input,
    record_tensor,
    set_record,
    state_record,
    tensor_record,
)
from fl_app.protocol import replies, requests  # noqa: E402 - the builders and readers, as P.requests.forward(...)
from fl_app.protocol.replies import ReplySchema, reply_schema
from fl_app.protocol.requests import RelayTag
