"""The flat-vector bookkeeping every backend shares (rows of a Jacobian, `.grad` written from one vector) and the
backend lookup, on hand-made cases."""

from __future__ import annotations

import pytest
import torch

from mtlflow.core.errors import UnknownNameError
from mtlflow.grad_engine import jacobian_backend
from mtlflow.grad_engine._flat import flatten_rows, write_flat_grad


def test_flatten_rows_concatenates_per_parameter_rows_and_fills_missing_ones_with_zeros():
    a, b = torch.zeros(2, 3), torch.zeros(4)
    rows = [torch.arange(12.0).reshape(2, 2, 3), None]
    flat = flatten_rows(rows, [a, b], k=2)
    expected = torch.cat([torch.arange(12.0).reshape(2, 6), torch.zeros(2, 4)], dim=1)
    assert torch.equal(flat, expected)
    empty = flatten_rows([], [], k=3)  # no shared parameter: K empty rows
    assert empty.shape == (3, 0)


def test_write_flat_grad_sets_then_accumulates_in_each_parameters_dtype():
    p32 = torch.zeros(2, 2, dtype=torch.float32, requires_grad=True)
    p64 = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    flat = torch.arange(1.0, 8.0, dtype=torch.float64)
    write_flat_grad([p32, p64], flat)
    assert p32.grad.dtype == torch.float32 and p64.grad.dtype == torch.float64
    assert torch.equal(p32.grad, torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert torch.equal(p64.grad, torch.tensor([5.0, 6.0, 7.0], dtype=torch.float64))
    write_flat_grad([p32, p64], flat, accumulate=True)
    assert torch.equal(p64.grad, torch.tensor([10.0, 12.0, 14.0], dtype=torch.float64))
    write_flat_grad([p32, p64], flat)  # without accumulate: replaced, not added
    assert torch.equal(p64.grad, torch.tensor([5.0, 6.0, 7.0], dtype=torch.float64))
    fresh = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    write_flat_grad([fresh], flat[:3], accumulate=True)  # nothing to accumulate onto: set
    assert torch.equal(fresh.grad, flat[:3])
    with pytest.raises(ValueError, match="gradient vector has 7 entries for 3 parameters"):
        write_flat_grad([fresh], flat)


def test_an_unknown_backend_names_itself_and_the_valid_ones():
    with pytest.raises(UnknownNameError) as exc:
        jacobian_backend("nope")
    assert exc.value.kind == "Jacobian backend" and exc.value.name == "nope"
    assert exc.value.valid == ["loop", "batched", "func", "autojac"]
    assert str(exc.value) == "unknown Jacobian backend 'nope'; valid Jacobian backends: loop, batched, func, autojac"
