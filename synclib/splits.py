"""Train/test, validation and CV splits by whole groups (episodes), as the reference code splits.

numpy only: the dry run sizes a run's training sets with :func:`episode_split` without
importing torch.  :mod:`synclib.analysis.ridge` fits on these splits.

:func:`episode_split`     the reference's train/test split by whole groups (episodes)
:func:`validation_split`  a training set's fitting and validation parts, by whole groups
:func:`episode_folds`     CV folds by whole groups, for ``alpha="cv"``
"""
from __future__ import annotations

import numpy as np

__all__ = ["episode_split", "validation_split", "episode_folds", "RidgeInputError",
           "VALIDATION_SEED_OFFSET"]


class RidgeInputError(ValueError):
    """Input that a ridge fit, a grid or a split cannot be computed from (names the parameter)."""


def _group_codes(groups, n_groups):
    """Groups as codes ``0 .. n_groups-1`` and the label of each code.

    With ``n_groups`` the groups must already be integer codes in ``[0, n_groups)``
    (e.g. positions along the cube's episode dim); otherwise the distinct labels,
    sorted, are the groups.
    """
    groups = np.asarray(groups)
    if n_groups is None:
        labels, codes = np.unique(groups, return_inverse=True)
        return codes.ravel(), labels
    if groups.size and (groups.dtype.kind not in "iu" or groups.min() < 0 or groups.max() >= n_groups):
        raise RidgeInputError(f"groups: with n_groups={n_groups} the groups must be integers in "
                              f"0 .. {n_groups - 1}")
    return groups.astype(np.int64), np.arange(n_groups)


def _take(perm: np.ndarray, counts: np.ndarray, start: int, need: int) -> int:
    """Walk ``perm`` from ``start``, taking whole groups while fewer than ``need`` samples
    (``counts`` per group) are taken and groups remain; returns the end position."""
    i, got = start, 0
    while got < need and i < len(perm):
        got += counts[perm[i]]
        i += 1
    return i


def episode_split(groups, n_samples: int | None = 6500, seed=0, *, n_groups: int | None = None,
                  train_frac: float = 0.8):
    """Train/test split by whole groups (episodes), as the reference code splits.

    The rule of the reference (``affine_transformation.py`` ``sampling_with_full_episodes``,
    protocol correction 11): with ``N = n_samples``, the targets are
    ``n_train* = int(train_frac * N)`` and ``n_test* = N - n_train*`` (6,500 -> 5,200 /
    1,300).  ``perm = np.random.RandomState(seed).permutation(n_groups)`` orders *all*
    groups, including groups without samples.  The test set takes ``perm[0], perm[1],
    ...`` while it holds fewer than ``n_test*`` samples; the training set takes the
    following groups while it holds fewer than ``n_train*`` samples and groups remain.
    With fewer than ``N`` samples (``short``) the test set still takes ``>= n_test*``
    and the training set all the rest; nothing is ever upsampled.

    Guard (ours): where the test set leaves no sample for training the reference
    solves a singular system; here a :class:`RidgeInputError` says so.

    Parameters
    ----------
    groups : array, shape (n,)
        Group of each sample.  With ``n_groups``: integer codes in ``[0, n_groups)``
        (e.g. positions along the cube's episode dim); without: any labels, the
        distinct labels in sorted order being the groups.
    n_samples : int or None
        ``N``, the total sample size; ``None``: ``N`` = all samples (the training set
        then takes every sample the test set leaves).
    seed : int or numpy.random.RandomState
        Split seed; a ``RandomState`` is used as it is and left advanced past the
        permutation (the shuffled control continues it).
    n_groups : int, optional
        Number of groups, including groups without samples (the reference permutes
        every listed episode).
    train_frac : float
        Fraction of ``N`` the training set aims at (0.8).

    Returns
    -------
    train : int array, shape (n_train,)
        Indices into the samples, ascending.
    test : int array, shape (n_test,)
    info : dict
        ``n_available`` (n), ``n_requested`` (-1 for None), ``short`` (1: fewer than
        ``n_samples`` samples, the training set took all the rest), ``n_train``,
        ``n_test``, ``train_groups``, ``test_groups`` (group labels in the order taken,
        empty groups included, as the reference's ``train_set_idx``/``test_set_idx``).

    Raises
    ------
    RidgeInputError
        ``n_samples < 2``, ``train_frac`` outside (0, 1), groups outside
        ``0 .. n_groups-1``, no samples, or no sample left for training.
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


#: added to a split seed for the validation split inside its training set (:func:`validation_split`),
#: so that the inner permutation is not the outer one's
VALIDATION_SEED_OFFSET = 10_000


def validation_split(groups, seed: int, val_frac: float = 0.2):
    """A training set's fitting and validation parts, by whole groups (episodes).

    The rule of :func:`episode_split` on the training samples alone, with all of them
    (``n_samples=None``): the validation part takes whole groups, in the order of
    ``RandomState(seed + VALIDATION_SEED_OFFSET).permutation``, until it holds at least
    ``val_frac`` of the samples; the fitting part takes the rest.  Whatever is chosen on the
    validation part (a layer, a penalty) never sees the test set of the outer split.

    Parameters
    ----------
    groups : array, shape (n_train,)
        Group (episode) of each training sample.
    seed : int
        The outer split's seed.
    val_frac : float
        Fraction of the training samples for validation (0.2).

    Returns
    -------
    fit, val : int arrays
        Indices into ``groups``.

    Raises
    ------
    RidgeInputError
        Too few samples, or the validation part leaves nothing to fit.
    """
    fit, val, _ = episode_split(groups, None, int(seed) + VALIDATION_SEED_OFFSET, train_frac=1 - val_frac)
    return fit, val


def episode_folds(groups, n_folds: int, seed: int = 0) -> list[np.ndarray]:
    """Assign whole groups (episodes) to ``n_folds`` folds of similar sample count.

    Parameters
    ----------
    groups : array, shape (n,)
        Group label per sample.
    n_folds : int
        Number of folds (>= 2).
    seed : int
        Shuffles the groups.

    Returns
    -------
    list of bool arrays, shape (n,)
        One validation mask per fold.
    """
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
