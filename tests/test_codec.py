"""Tests for fl_app/protocol/codec.py: the .npy codec, deferred arrays, and the reply finiteness check."""

import pickle

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fl_app import protocol as P
from fl_app.protocol.codec import DeferredArray, decode_array, encode_array, view_array
from strategies.core.validation import _all_finite


def _npy(values: np.ndarray) -> bytes:
    return Array(values).data  # Flower's own encoding (np.save)


@pytest.mark.parametrize("values", [np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(5, dtype=np.int64),
                                    np.float64(2.5) * np.ones((2, 1, 3))])
def test_encode_array_writes_flowers_bytes(values):
    encode_array(values)  # the first call caches the header
    assert encode_array(values).data == _npy(values)
    np.testing.assert_array_equal(decode_array(encode_array(values)), values)


def test_deferred_array_is_indistinguishable_from_the_encoded_one():
    t = torch.randn(4, 3, 2)
    a = P.tensor_array(t)
    assert type(a) is DeferredArray
    assert "_data" not in a.__dict__  # nothing written yet
    assert (a.dtype, tuple(a.shape), a.stype) == ("float32", (4, 3, 2), "numpy.ndarray")
    np.testing.assert_array_equal(view_array(a), t.numpy())  # read without writing the bytes
    assert "_data" not in a.__dict__
    assert a.data == _npy(t.numpy())  # written on the first read of data, once
    assert a.data is a.data
    np.testing.assert_array_equal(a.numpy(), t.numpy())
    # pickles (checkpoints, Ray) as a plain Array with the same bytes
    b = pickle.loads(pickle.dumps(a))
    assert type(b) is Array and b.data == a.data and tuple(b.shape) == (4, 3, 2)


def test_deferred_array_keeps_its_bytes_through_flowers_object_tree():
    """Flower's content-addressed ids and deflated records (what it sends) equal the plain Array's."""
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    record = P.tensor_record("x", t)
    plain = ArrayRecord({"x": Array(t.numpy())})
    assert record["x"].object_id == plain["x"].object_id
    assert record["x"].deflate() == plain["x"].deflate()
    assert record.object_id == plain.object_id
    content = RecordDict({"acts": record, "cfg": ConfigRecord({"a": 1})})
    assert content.object_id == RecordDict({"acts": plain, "cfg": ConfigRecord({"a": 1})}).object_id


def test_deferred_array_refuses_a_tensor_changed_in_place():
    t = torch.zeros(3)
    a = P.tensor_array(t)
    t.add_(1.0)
    with pytest.raises(RuntimeError, match="changed in place"):
        a.data  # noqa: B018
    with pytest.raises(RuntimeError, match="changed in place"):
        view_array(a)


def test_record_input_shares_a_deferred_tensor_and_copies_bytes():
    t = torch.randn(2, 5)
    shared = P.record_input(P.tensor_record("x", t), "x")
    assert shared.data_ptr() == t.data_ptr() and shared is not t
    shared.requires_grad_(True)  # a new tensor object: the sender's flags are untouched
    assert not t.requires_grad
    plain = ArrayRecord({"x": Array(t.numpy())})
    copied = P.record_input(plain, "x")
    assert copied.data_ptr() != t.data_ptr() and torch.equal(copied, t)
    fresh = P.record_tensor(P.tensor_record("x", t), "x")  # record_tensor still copies
    assert fresh.data_ptr() != t.data_ptr() and torch.equal(fresh, t)


def test_value_token_is_stable_and_canonical_keeps_deferred_arrays():
    a = P.tensor_array(torch.ones(3))
    token = P.value_token(a)
    a.data  # noqa: B018 - writing the bytes does not change the token
    assert P.value_token(a) is token
    assert P.canonical(a) is a
    b = encode_array(np.ones(3, dtype=np.float32))
    assert P.value_token(b) is b.data


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_all_finite(dtype):
    x = np.linspace(-3, 3, 10_000).astype(dtype)
    assert _all_finite(x)
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[1234] = bad
        assert not _all_finite(y)
    # finite values whose sum of squares overflows: checked one by one, still finite
    big = np.full(100, np.finfo(dtype).max / 2, dtype=dtype)
    assert _all_finite(big)
    assert _all_finite(np.zeros(0, dtype=dtype))


def test_record_helpers_build_what_flowers_constructors_build():
    """array_record / record_dict / set_record store the records themselves, as Flower's own API would."""
    x = P.tensor_array(torch.arange(4, dtype=torch.float32))
    fast = P.array_record({"x": x})
    slow = ArrayRecord()
    slow["x"] = x
    assert dict(fast.items()) == dict(slow.items()) and fast["x"] is x
    assert fast.is_dirty and fast.object_id == slow.object_id
    cfg = ConfigRecord({"a": 1})
    content = P.record_dict({"acts": fast, "cfg": cfg})
    assert content["acts"] is fast and content["cfg"] is cfg
    assert content.object_id == RecordDict({"acts": slow, "cfg": ConfigRecord({"a": 1})}).object_id
    P.set_record(content, "cfg", ConfigRecord({"a": 2}))
    assert content["cfg"]["a"] == 2 and len(content) == 2
    with pytest.raises(TypeError):
        P.array_record({"x": np.zeros(2)})
    with pytest.raises(TypeError):
        P.record_dict({1: cfg})
    with pytest.raises(TypeError):
        P.set_record(content, "z", {"a": 1})
