"""The chunked oracle's tie rule (``oracle.assert_exact_chunked``): real ties must be ordered by
index, near-ties of a metric whose float64 arithmetic rounds may go either way."""

from __future__ import annotations

import pytest
import torch

from oracle import assert_exact_chunked


def _saturated() -> tuple[torch.Tensor, torch.Tensor]:
    """A query and two corpus rows of saturated pixels, each 254 at a different position:
    mathematically at one distance from the query under every metric."""
    q = torch.full((1, 64), 255.0, dtype=torch.float64)
    q[0, :4] = torch.tensor([241.0, 251.0, 247.0, 234.0])
    c = torch.full((3, 64), 255.0, dtype=torch.float64)
    c[0, :] = 0.0
    c[0, 0] = 1.0  # far in every metric
    c[1, 39] = 254.0
    c[2, 31] = 254.0
    return q, c


def _answer(idx: list[int], q: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An answer holding ``idx`` with the two tied rows' shared distance (euclidean)."""
    d = torch.cdist(q, c[idx])  # one row: far below the 25 rows where cdist stops being an oracle
    return torch.tensor([idx]), d.float().double()  # knng returns float64 distances rounded to float32


def test_integer_ties_must_keep_the_smaller_index():
    q, c = _saturated()
    idx, dist = _answer([2], q, c)
    with pytest.raises(AssertionError, match="tied smaller"):
        assert_exact_chunked(q, c, [(idx, dist)], "euclidean", device="cpu")
    idx, dist = _answer([1], q, c)
    assert_exact_chunked(q, c, [(idx, dist)], "euclidean", device="cpu")


def test_identical_vectors_must_keep_the_smaller_index_under_cosine():
    q, c = _saturated()
    c[2] = c[1]
    cos = 1 - (q[0] @ c[1]) / (q[0].norm() * c[1].norm())
    dist = torch.tensor([[float(cos)]], dtype=torch.float32).double()
    with pytest.raises(AssertionError, match="tied smaller"):
        assert_exact_chunked(q, c, [(torch.tensor([[2]]), dist)], "cosine", device="cpu")


@pytest.mark.parametrize("keep", [1, 2])
def test_cosine_near_ties_of_different_vectors_go_either_way(keep):
    q, c = _saturated()
    qh, ch = q[0] / q[0].norm(), c[keep] / c[keep].norm()
    dist = torch.tensor([[float(0.5 * ((qh - ch) ** 2).sum())]], dtype=torch.float32).double()
    assert_exact_chunked(q, c, [(torch.tensor([[keep]]), dist)], "cosine", device="cpu")
