r"""Stratified, seeded subsets and splits of a labelled dataset.

Both functions shuffle the indices of each class :math:`c` with
``numpy.random.default_rng([seed, c])`` and take a prefix of that order, so a result depends only
on the labels and the seed (never on the order of other classes or on the machine).
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

__all__ = ["stratified_subset", "stratified_split"]


def _class_orders(labels: np.ndarray, seed: int) -> Dict[int, np.ndarray]:
    orders = {}
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        orders[int(c)] = members[np.random.default_rng([seed, int(c)]).permutation(members.size)]
    return orders


def _check_labels(labels) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a non-empty 1-D integer array, got {labels.dtype} of shape {labels.shape}")
    if labels.min() < 0:
        raise ValueError(f"labels must be non-negative, got {int(labels.min())}")
    return labels


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def stratified_subset(labels: Sequence[int], samples_per_class: int, seed: int = 0, *, what: str = "dataset") -> np.ndarray:
    r"""Indices of ``samples_per_class`` samples of every class, chosen at random by ``seed``.

    Class :math:`c` contributes the first :math:`k` indices of its seeded shuffle; the result is
    sorted. A larger :math:`k` with the same seed gives a superset.

    Args:
        labels: the label of every sample (non-negative integers).
        samples_per_class: :math:`k \ge 1`.
        seed: non-negative integer.
        what: how to name the dataset in errors (e.g. ``'the training split of /data/N-MNIST'``).

    Returns:
        sorted ``int64`` indices, :math:`k` per class present in ``labels``.

    Raises:
        ValueError: :math:`k < 1`, or a class has fewer than :math:`k` samples (all such classes
            are named with their counts).
    """
    labels = _check_labels(labels)
    seed = _check_seed(seed)
    if isinstance(samples_per_class, bool) or not isinstance(samples_per_class, (int, np.integer)) or samples_per_class < 1:
        raise ValueError(f"samples_per_class must be an integer >= 1, got {samples_per_class!r}")
    orders = _class_orders(labels, seed)
    short = {c: o.size for c, o in orders.items() if o.size < samples_per_class}
    if short:
        listed = ", ".join(f"class {c}: {n}" for c, n in short.items())
        raise ValueError(
            f"samples_per_class={samples_per_class} is more than {what} has of some classes ({listed})"
        )
    return np.sort(np.concatenate([o[:samples_per_class] for o in orders.values()])).astype(np.int64)


def stratified_split(
    labels: Sequence[int], *, test_count: Optional[int] = None, test_fraction: Optional[float] = None, seed: int = 0
) -> Dict[str, np.ndarray]:
    r"""Split indices into training and test sets with every class in the same proportion.

    With :math:`n_c` samples of class :math:`c` and a test size :math:`m` (``test_count``, or
    ``round(test_fraction * n)``), class :math:`c` gets :math:`m_c` test samples by the largest
    remainder rule, so that :math:`\sum_c m_c = m` exactly:

    .. math::

        q_c = \frac{m\, n_c}{n}, \qquad
        m_c = \lfloor q_c \rfloor + [\, c \text{ among the } m - \textstyle\sum_c \lfloor q_c \rfloor
        \text{ largest } q_c - \lfloor q_c \rfloor \,]

    (ties to the smaller class label). The first :math:`m_c` of class :math:`c`'s seeded shuffle
    are its test samples, the rest its training samples.

    Args:
        labels: the label of every sample.
        test_count: :math:`m`, the size of the test set; or
        test_fraction: its fraction of all samples, in (0, 1). Give exactly one.
        seed: non-negative integer.

    Returns:
        dict with ``'train'`` and ``'test'``: sorted ``int64`` index arrays.
    """
    labels = _check_labels(labels)
    seed = _check_seed(seed)
    n = labels.size
    if (test_count is None) == (test_fraction is None):
        raise ValueError("give exactly one of test_count and test_fraction")
    if test_fraction is not None:
        if not 0.0 < float(test_fraction) < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
        test_count = int(round(float(test_fraction) * n))
    if isinstance(test_count, bool) or not isinstance(test_count, (int, np.integer)) or not 0 <= test_count <= n:
        raise ValueError(f"test_count must be an integer in [0, {n}], got {test_count!r}")
    orders = _class_orders(labels, seed)
    classes = sorted(orders)
    quota = np.array([test_count * orders[c].size / n for c in classes])
    counts = np.floor(quota).astype(np.int64)
    remainder = quota - counts
    extra = test_count - int(counts.sum())
    for i in sorted(range(len(classes)), key=lambda i: (-remainder[i], classes[i]))[:extra]:
        counts[i] += 1
    test = [orders[c][:k] for c, k in zip(classes, counts)]
    train = [orders[c][k:] for c, k in zip(classes, counts)]
    return {"train": np.sort(np.concatenate(train)).astype(np.int64), "test": np.sort(np.concatenate(test)).astype(np.int64)}
