"""Train/test (:func:`episode_split`, the reference's), validation (:func:`validation_split`) and CV
(:func:`episode_folds`, for ``alpha="cv"``) splits by whole groups (episodes).  numpy only, for the dry run.
"""
from __future__ import annotations

import numpy as np

__all__ = ["episode_split", "validation_split", "episode_folds", "RidgeInputError",
           "VALIDATION_SEED_OFFSET"]


class RidgeInputError(ValueError):
    """Input that a ridge fit, a grid or a split cannot be computed from (names the parameter)."""


def _group_codes(groups, n_groups):
    """Groups as codes ``0 .. n_groups-1`` and the label of each code (see :func:`episode_split`)."""
    groups = np.asarray(groups)
    if n_groups is None:
        labels, codes = np.unique(groups, return_inverse=True)
        return codes.ravel(), labels
    if groups.size and (groups.dtype.kind not in "iu" or groups.min() < 0 or groups.max() >= n_groups):
        raise RidgeInputError(f"groups: with n_groups={n_groups} the groups must be integers in "
                              f"0 .. {n_groups - 1}")
    return groups.astype(np.int64), np.arange(n_groups)


def _take(perm: np.ndarray, counts: np.ndarray, start: int, need: int) -> int:
    """The end position of whole groups taken from ``perm[start:]`` until ``need`` samples or no groups remain."""
    i, got = start, 0
    while got < need and i < len(perm):
        got += counts[perm[i]]
        i += 1
    return i


def episode_split(groups, n_samples: int | None = 6500, seed=0, *, n_groups: int | None = None,
                  train_frac: float = 0.8):
    """Train/test split by whole groups (episodes), as the reference code splits.

    The reference's rule (``affine_transformation.py`` ``sampling_with_full_episodes``, protocol correction 11):
    the targets are ``n_train* = int(train_frac * N)`` and ``n_test* = N - n_train*`` (6,500 -> 5,200 / 1,300);
    ``perm = np.random.RandomState(seed).permutation(n_groups)`` orders *all* groups, empty ones included; the
    test set takes ``perm[0], perm[1], ...`` while it holds fewer than ``n_test*`` samples, the training set
    the following groups while it holds fewer than ``n_train*`` and groups remain.  With fewer than ``N``
    samples (``short``) the training set takes all the rest; nothing is upsampled.

    Parameters
    ----------
    groups : array, shape (n,)
        Group of each sample: with ``n_groups``, integer codes in ``[0, n_groups)`` (e.g. positions along the
        cube's episode dim); without, any labels, the distinct labels in sorted order being the groups.
    n_samples : int or None
        ``N``, the total sample size; ``None``: all samples.
    seed : int or numpy.random.RandomState
        Split seed; a ``RandomState`` is used as it is and left advanced (the shuffled control continues it).
    n_groups : int, optional
        Number of groups, including groups without samples.
    train_frac : float
        Fraction of ``N`` the training set aims at.

    Returns
    -------
    train : int array, shape (n_train,)
        Indices into the samples, ascending.
    test : int array, shape (n_test,)
    info : dict
        ``n_available`` (n), ``n_requested`` (-1 for None), ``short`` (0 or 1), ``n_train``, ``n_test``,
        ``train_groups``, ``test_groups`` (labels in the order taken, empty groups included, as the reference's
        ``train_set_idx``/``test_set_idx``).

    Raises
    ------
    RidgeInputError
        ``n_samples < 2``, ``train_frac`` outside (0, 1), groups outside ``0 .. n_groups-1``, no samples, or no
        sample left for training (where the reference would solve a singular system).
    """
    if n_samples is not None and n_samples < 2:
        raise RidgeInputError(f"n_samples must be >= 2, got {n_samples}")
    if not 0 < train_frac < 1:
        raise RidgeInputError(f"train_frac must be in (0, 1), got {train_frac}")
    codes, labels = _group_codes(groups, n_groups)
    n = len(codes)
    if n == 0:
        raise RidgeInputError("groups: no samples to split")
    total = n if n_samples is None else int(n_samples)
    need_train = int(train_frac * total)
    need_test = total - need_train
    counts = np.bincount(codes, minlength=len(labels))
    rs = seed if isinstance(seed, np.random.RandomState) else np.random.RandomState(int(seed))
    perm = rs.permutation(len(labels))
    i = _take(perm, counts, 0, need_test)
    j = _take(perm, counts, i, need_train)
    test_g, train_g = perm[:i], perm[i:j]
    if counts[train_g].sum() == 0:
        raise RidgeInputError(
            f"n_samples: the test set takes whole groups until it holds >= {need_test} samples and "
            f"leaves none of the {n} available for training (the reference code would solve a "
            f"singular system here)")
    in_test = np.zeros(len(labels), dtype=bool)
    in_test[test_g] = True
    in_train = np.zeros(len(labels), dtype=bool)
    in_train[train_g] = True
    tr, te = np.flatnonzero(in_train[codes]), np.flatnonzero(in_test[codes])
    return tr, te, {"n_available": n, "n_requested": -1 if n_samples is None else int(n_samples),
                    "short": int(n_samples is not None and n < n_samples), "n_train": len(tr),
                    "n_test": len(te), "train_groups": labels[train_g], "test_groups": labels[test_g]}


#: added to a split seed for the validation split inside its training set, so the two permutations differ
VALIDATION_SEED_OFFSET = 10_000


def validation_split(groups, seed: int, val_frac: float = 0.2):
    """A training set's fitting and validation parts (indices into ``groups``, the training samples' episodes):
    :func:`episode_split` of all of them with seed ``seed + VALIDATION_SEED_OFFSET`` (``seed``: the outer
    split's), the validation part taking at least ``val_frac`` of the samples.  Raises :class:`RidgeInputError`
    for too few samples or nothing left to fit."""
    fit, val, _ = episode_split(groups, None, int(seed) + VALIDATION_SEED_OFFSET, train_frac=1 - val_frac)
    return fit, val


def episode_folds(groups, n_folds: int, seed: int = 0) -> list[np.ndarray]:
    """One validation mask (n,) per fold: whole groups (labels ``groups`` (n,), shuffled by ``seed``) assigned
    to ``n_folds`` (>= 2) folds of similar sample count."""
    groups = np.asarray(groups)
    uniq, inv, counts = np.unique(groups, return_inverse=True, return_counts=True)
    if len(uniq) < n_folds:
        raise RidgeInputError(f"groups: alpha='cv' needs at least cv_folds={n_folds} distinct groups "
                              f"(episodes) in the training set, got {len(uniq)}")
    order = np.random.default_rng(seed).permutation(len(uniq))
    load = np.zeros(n_folds)
    fold_of = np.empty(len(uniq), dtype=int)
    for g in order:  # greedy: next group to the lightest fold
        f = int(np.argmin(load))
        fold_of[g] = f
        load[f] += counts[g]
    return [fold_of[inv] == f for f in range(n_folds)]
