"""Checks of a client's reply before any strategy decodes it (issue 12, faults).

Every reply passes through :meth:`strategies.core.base.SFLStrategy.receive`, which
calls :meth:`~strategies.core.base.SFLStrategy.validate_reply` and so
:meth:`ReplyChecker.problem`. A reply with a problem is handled like an error
reply: the client is excluded with a one-line reason in the log, and the run
goes on with the others. What is checked follows from the request alone (its
action, typed config and records, read by :func:`fl_app.protocol.replies.reply_schema`)
and from the task's shapes:

* the records the action must return are there (activations and labels of a
  forward, weights and example count when weights are asked for, the input
  gradient of a range that does not start at block 0, ...);
* activations are float32 ``[B, *shape]``: ``B`` the batch asked for (or the
  relayed input's), ``shape`` the output of the range's last block (or, after
  a backward, the shape of the gradient sent); labels int64 ``[B]`` in
  ``[0, num_classes)``; perturbed embeddings ``[P, B, *shape]``; an input
  gradient the shape of the input sent;
* weights name tensors of the model with their shapes and dtypes (all of
  them for ``train.fit``), and the example count is the handshake's;
* every floating-point array is finite (activations, gradients, weights).

A request without a ``config`` record (not built from the protocol's typed
configs) gets only the finiteness check. One exception: a reply to a
``train.forward`` with ``loss`` whose reported
loss is not finite is passed on unchecked for finiteness, so that the
strategy stops the run as diverged (its :meth:`check_loss`) rather than
excluding a client for the run's own divergence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from fl_app import protocol as P
from fl_app.protocol import replies
from fl_app.learning.task import Task
from strategies.core.dispatcher import Request

__all__ = ["ReplyChecker", "ReplyProblem"]


@dataclass(frozen=True)
class ReplyProblem:
    """Why a reply cannot be used.

    Attributes:
        reason: one line for the log (e.g. ``"activations/x has shape (8, 3)
            dtype float32, expected (8, 64, 7, 7) float32"``).
        non_finite: the problem is NaN or infinite values (a sign of
            divergence when every client shows it, see
            :meth:`strategies.core.base.SFLStrategy.receive`).
    """

    reason: str
    non_finite: bool = False


class _Bad(Exception):
    def __init__(self, reason: str, non_finite: bool = False) -> None:
        super().__init__(reason)
        self.problem = ReplyProblem(reason, non_finite)


class ReplyChecker:
    """Validates replies against what their requests ask for (see the module docstring).

    Args:
        task: the run's task: the model's per-block output shapes
            (:attr:`Task.profiles`), its state_dict's names, shapes and
            dtypes, the number of classes and the default cut layer.
    """

    def __init__(self, task: Task) -> None:
        self.task = task
        self.num_classes = task.data.num_classes
        self.cut = task.cut_layer
        state = task.build_model().state_dict()
        #: state_dict name -> (shape, numpy dtype name) of the full model
        self.model_arrays = {k: (tuple(v.shape), str(v.numpy().dtype)) for k, v in state.items()}
        #: value tokens of label arrays already found in range (relayed labels come back hop after hop as
        #: the same immutable array; its values need checking once)
        self._labels_in_range: dict[int, object] = {}

    def output_shape(self, end: int) -> tuple[int, ...]:
        """Per-sample output shape of block ``end - 1`` (the last block of a range ``[start, end)``).

        A text dataset's batches are padded to their longest sentence
        (:class:`fl_app.data.text.TextDataset`): a ``(T, D)`` activation's
        ``T`` is then given as ``-T``, any length from 1 to ``T``.
        """
        shape = tuple(self.task.profiles[end - 1].output_shape)
        if getattr(self.task.data, "variable_length", False) and len(shape) == 2:
            return (-shape[0], shape[1])
        return shape

    def _any_length(self, sample: tuple[int, ...] | None) -> tuple[int, ...] | None:
        """``sample`` with a text batch's ``T`` as ``-T_max`` (see :meth:`output_shape`)."""
        if sample is None or not getattr(self.task.data, "variable_length", False) or len(sample) != 2:
            return sample
        return (-int(self.task.data.input_shape[-1]), sample[1])

    def problem(self, request: Request, content: RecordDict | None, num_examples: int | None = None
                ) -> ReplyProblem | None:
        """What is wrong with ``content`` as the reply to ``request``, or None when it is usable.

        Args:
            request: the request it answers (action and content as sent).
            content: the reply's content.
            num_examples: the client's example count from the handshake
                (checked against a reported ``num-examples``); None: not checked.

        Returns:
            None, or a :class:`ReplyProblem` with a one-line reason.
        """
        try:
            if content is None:
                raise _Bad("empty reply")
            self._check(request, content, num_examples)
        except _Bad as bad:
            return bad.problem
        return None

    # ------------------------------------------------------------------ per action
    def _check(self, request: Request, content: RecordDict, num_examples: int | None) -> None:
        schema = replies.reply_schema(request.action, request.content, self.cut)
        skip_finite = False
        if schema is not None:  # None: not built from a protocol config (a test's bare request)
            for key in schema.info:
                value = self._info(content, key)
                if key == P.INFO_LOSS and schema.loss_exempt:
                    skip_finite = not _finite_number(value)
            if schema.input_gradient is not None:
                self._tensor(content, P.GRADIENT, "g", schema.input_gradient or None, "float32")
            if schema.activations is not None:
                batch, end = schema.activations
                sample = self.output_shape(end) if end is not None else self._any_length(schema.sample_shape)
                self._tensor(content, P.ACTIVATIONS, "x", None if sample is None else (batch, *sample), "float32")
            if schema.perturbed:
                x = content[P.ACTIVATIONS]["x"]
                if int(x.shape[0]) != batch:
                    raise _Bad(f"{P.ACTIVATIONS}/x has batch {int(x.shape[0])}, expected {batch}")
            if schema.labels is not None:
                self._labels(content, schema.labels)
            if schema.perturbed:
                for name in ("plus", "minus"):
                    self._tensor(content, P.PERTURBED, name, (schema.perturbed, *tuple(int(s) for s in x.shape)),
                                 "float32")
            if schema.weights:
                self._weights(content, num_examples, complete=schema.weights == "all")
        if not skip_finite:
            self._finite(content)

    # ------------------------------------------------------------------ pieces
    def _info(self, content: RecordDict, key: str) -> Any:
        info = P.get_config(content, P.INFO)
        if info is None or key not in info:
            raise _Bad(f"missing {P.INFO}/{key}")
        return info[key]

    @staticmethod
    def _tensor(content: RecordDict, key: str, name: str, shape: tuple[int, ...] | None, dtype: str) -> None:
        record = P.get_array(content, key)
        if record is None or name not in record:
            raise _Bad(f"missing {key}/{name}")
        arr = record[name]
        got_shape, got_dtype = tuple(int(s) for s in arr.shape), str(arr.dtype)
        if shape is not None and len(got_shape) == len(shape):  # -T: any length 1..T (text batches)
            got_shape = tuple(w if w < 0 and 1 <= g <= -w else g for g, w in zip(got_shape, shape))
        if got_dtype != dtype or (shape is not None and got_shape != tuple(shape)):
            want = f"{tuple(shape) if shape is not None else '[...]'} {dtype}"
            raise _Bad(f"{key}/{name} has shape {got_shape} dtype {got_dtype}, expected {want}")

    def _labels(self, content: RecordDict, batch: int) -> None:
        self._tensor(content, P.LABELS, "y", (batch,), "int64")
        token = P.value_token(content[P.LABELS]["y"])
        if self._labels_in_range.get(id(token)) is token:
            return
        y = _values(content[P.LABELS], "y")
        if y.size and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
            raise _Bad(f"{P.LABELS}/y has labels outside [0, {self.num_classes})")
        if len(self._labels_in_range) >= 256:
            self._labels_in_range.clear()
        self._labels_in_range[id(token)] = token

    def _weights(self, content: RecordDict, num_examples: int | None, complete: bool) -> None:
        record = P.get_array(content, P.WEIGHTS)
        if record is None or not len(record):
            raise _Bad(f"missing {P.WEIGHTS}")
        for name in record.keys():
            if name not in self.model_arrays:
                raise _Bad(f"{P.WEIGHTS} has a tensor {name!r} the model does not have")
            shape, dtype = self.model_arrays[name]
            arr = record[name]
            if tuple(int(s) for s in arr.shape) != shape or str(arr.dtype) != dtype:
                raise _Bad(f"{P.WEIGHTS}/{name} has shape {tuple(arr.shape)} dtype {arr.dtype}, "
                           f"expected {shape} {dtype}")
        if complete and len(record) != len(self.model_arrays):
            missing = sorted(set(self.model_arrays) - set(record.keys()))
            raise _Bad(f"{P.WEIGHTS} lacks {len(missing)} tensors of the model (first: {missing[0]!r})")
        count = self._info(content, P.INFO_NUM_EXAMPLES)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise _Bad(f"{P.INFO}/{P.INFO_NUM_EXAMPLES} is {count!r}, expected a positive integer")
        if num_examples is not None and count != num_examples:
            raise _Bad(f"reports {count} examples, the handshake said {num_examples}")

    @staticmethod
    def _finite(content: RecordDict) -> None:
        for key, record in content.items():
            if not isinstance(record, ArrayRecord):
                continue
            for name in record.keys():
                arr = record[name]
                if not np.issubdtype(np.dtype(arr.dtype), np.floating):
                    continue
                values = _values(record, name)
                if not _all_finite(values):
                    kind = "NaN" if np.isnan(values).any() else "infinite"
                    raise _Bad(f"{kind} values in {key}/{name}", non_finite=True)


def _all_finite(values: np.ndarray) -> bool:
    """Whether every value of the flat float array ``values`` is finite.

    A finite sum of squares (one BLAS pass, no temporary) proves it: a NaN or an
    infinity makes the sum NaN or infinite. Only when it is not finite (also when
    finite values overflow it) are the values checked one by one.
    """
    if values.dtype in (np.float32, np.float64) and values.ndim == 1 and np.isfinite(np.dot(values, values)):
        return True
    return bool(np.isfinite(values).all())


def _values(record: ArrayRecord, name: str) -> np.ndarray:
    """The values of ``record[name]`` as a flat read-only array, without copying when possible.

    A ``.npy`` payload is the trailing ``count * itemsize`` bytes of
    ``Array.data`` (in C or Fortran order: the order does not matter for
    finiteness or a range check); other serialisations are decoded.
    """
    arr = record[name]
    if isinstance(arr, P.DeferredArray):  # its values, no bytes written
        return arr.values().reshape(-1)
    dtype = np.dtype(arr.dtype)
    count = math.prod(int(s) for s in arr.shape)
    data = arr.data
    if str(arr.stype) == "numpy.ndarray" and not dtype.hasobject and len(data) >= count * dtype.itemsize:
        return np.frombuffer(data, dtype=dtype, count=count, offset=len(data) - count * dtype.itemsize)
    return P.record_tensor(record, name).numpy().reshape(-1)


def _finite_number(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
