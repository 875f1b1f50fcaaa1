"""The ridge penalty as one object, :class:`Penalty`: a fixed ``alpha`` or one chosen by episode-grouped
cross-validation, validated once, here only.  Its fields (:data:`FIELDS`) are the config's keys
``analysis.<field>``, the command line's ``--<field>`` and the attributes an analysis records.  numpy only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from synclib.splits import RidgeInputError

__all__ = ["Penalty", "PAPER_ALPHA", "DEFAULT_CV_ALPHAS", "CV_GRID_RULE", "KINDS", "FIELDS", "FIELD_RULES",
           "check_alpha_value", "check_alphas", "check_folds", "check_columns", "check_seed"]

#: the paper's ridge penalty (``Ridge(alpha=0.1)``, ``affine_transformation.py``)
PAPER_ALPHA = 0.1
#: the log grid searched by ``alpha="cv"``, relative to each source layer's scale
#: (:func:`synclib.analysis.ridge.layer_scale`): 1e-3 ... 1e3 of it, half decades
DEFAULT_CV_ALPHAS = tuple(float(a) for a in np.logspace(-3, 3, 13))
CV_GRID_RULE = ("ours: alpha='cv' searches cv_alphas times each source layer's scale, the mean non-zero "
                "eigenvalue of Xc'Xc on the training rows (synclib.analysis.ridge.layer_scale: trace / min(n_train - 1, D)), "
                "so that one grid serves layers whose feature variances differ by orders of magnitude; the "
                "estimator stays the plain ridge of the raw features. A fixed alpha (the paper's 0.1) is used as "
                "it is.")
#: the kinds of penalty (:attr:`Penalty.kind`): a fixed ``alpha``, or one chosen per source layer by grouped CV
KINDS = ("fixed", "cv")
#: the fields of :class:`Penalty`
FIELDS = ("alpha", "cv_alphas", "cv_folds", "cv_columns", "cv_seed")
#: what each field (config key ``analysis.<field>``) allows
FIELD_RULES = {"alpha": "a number > 0 or 'cv'", "cv_alphas": "a non-empty list of numbers > 0",
               "cv_folds": "an integer >= 2", "cv_columns": "null or an integer >= 1", "cv_seed": "an integer >= 0"}


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_pos(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) \
        and math.isfinite(float(v)) and float(v) > 0


def check_alpha_value(value):
    """``value`` if ``"cv"`` or a number > 0, else RidgeInputError naming ``alpha``."""
    if value == "cv" if isinstance(value, str) else _is_pos(value):
        return value
    raise RidgeInputError(f"alpha must be {FIELD_RULES['alpha']}, got {value!r}")


def check_alphas(value) -> tuple:
    """The CV grid as a tuple of floats (multiples of each layer's scale)."""
    items = list(value) if isinstance(value, (list, tuple, np.ndarray)) else None
    if not items or not all(_is_pos(a) for a in items):
        raise RidgeInputError(f"cv_alphas (the CV grid) must be {FIELD_RULES['cv_alphas']}, got {value!r}")
    return tuple(float(a) for a in items)


def check_folds(value) -> int:
    if not _is_int(value) or value < 2:
        raise RidgeInputError(f"cv_folds (the CV folds) must be {FIELD_RULES['cv_folds']}, got {value!r}")
    return int(value)


def check_columns(value):
    if value is not None and (not _is_int(value) or value < 1):
        raise RidgeInputError(f"cv_columns (target columns per layer of the CV criterion) must be "
                              f"{FIELD_RULES['cv_columns']}, got {value!r}")
    return None if value is None else int(value)


def check_seed(value) -> int:
    if not _is_int(value) or value < 0:
        raise RidgeInputError(f"cv_seed (of the CV folds and columns) must be {FIELD_RULES['cv_seed']}, "
                              f"got {value!r}")
    return int(value)


def _alpha(value):
    """``"cv"``, or a fixed penalty: a float > 0, or a 1-D sequence (one per source layer) as a tuple of them."""
    if isinstance(value, str) and value == "cv":
        return value
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
        if items and all(_is_pos(x) for x in items):
            return tuple(float(x) for x in items)
    elif _is_pos(value):
        return float(value)
    raise RidgeInputError(f"alpha must be a positive number, an array of them or 'cv', got {value!r}")


#: older analyses' attribute names, read by :meth:`Penalty.from_attrs`
_OLD_ATTRS = {"alpha_grid": "cv_alphas", "penalty_folds": "cv_folds", "penalty_columns": "cv_columns",
              "penalty_seed": "cv_seed"}


@dataclass(frozen=True)
class Penalty:
    """The ridge penalty of a fit, checked once (errors name the field); a config section gives one as
    ``Penalty(**{f: section[f] for f in FIELDS})``.

    Parameters
    ----------
    alpha : float > 0, tuple (L_src,) of them, or "cv"
        A fixed penalty (one per source layer when a tuple), or ``"cv"``: each source layer's penalty chosen
        from ``cv_alphas`` times the layer's scale (:data:`CV_GRID_RULE`) by ``cv_folds``-fold CV over whole
        episodes of the training rows (:func:`synclib.analysis.ridge.r2_grid`).
    cv_alphas : tuple of float > 0
    cv_folds : int >= 2
    cv_columns : int >= 1 or None
        Target columns per target layer in the CV criterion (a fixed random subset; None: all).
    cv_seed : int >= 0
        Seed of the folds and of the columns' subset.
    """

    alpha: float | tuple | str = PAPER_ALPHA
    cv_alphas: tuple = DEFAULT_CV_ALPHAS
    cv_folds: int = 3
    cv_columns: int | None = 32
    cv_seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "alpha", _alpha(self.alpha))
        object.__setattr__(self, "cv_alphas", check_alphas(self.cv_alphas))
        object.__setattr__(self, "cv_folds", check_folds(self.cv_folds))
        object.__setattr__(self, "cv_columns", check_columns(self.cv_columns))
        object.__setattr__(self, "cv_seed", check_seed(self.cv_seed))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def of(cls, value) -> "Penalty":
        """``value`` if a Penalty, else ``Penalty(value)``."""
        return value if isinstance(value, Penalty) else cls(value)

    @classmethod
    def from_attrs(cls, attrs) -> "Penalty":
        """The penalty an analysis recorded (:meth:`attrs`, or older files' names)."""
        attrs = {_OLD_ATTRS.get(k, k): v for k, v in dict(attrs).items()}
        alpha = str(attrs.get("alpha", PAPER_ALPHA))
        if alpha != "cv":
            return cls(float(alpha))
        columns = int(attrs.get("cv_columns", 32))
        return cls("cv", tuple(np.atleast_1d(attrs.get("cv_alphas", DEFAULT_CV_ALPHAS)).tolist()),
                   int(attrs.get("cv_folds", 3)), None if columns < 0 else columns, int(attrs.get("cv_seed", 0)))

    # ------------------------------------------------------------------ reading it
    @property
    def cv(self) -> bool:
        """True where the penalty is chosen by cross-validation."""
        return self.alpha == "cv"

    @property
    def kind(self) -> str:
        """``"cv"`` or ``"fixed"`` (:data:`KINDS`)."""
        return "cv" if self.cv else "fixed"

    def is_paper(self) -> bool:
        """A fixed penalty equal to the paper's (:data:`PAPER_ALPHA`) for every map."""
        return not self.cv and bool(np.allclose(self.alpha, PAPER_ALPHA))

    def label(self) -> str:
        """In words: ``"λ = 0.1"`` or ``"λ chosen by cross-validation"``."""
        return "λ chosen by cross-validation" if self.cv else f"λ = {self.alpha}"

    def attrs(self) -> dict:
        """The netCDF attributes an analysis records: ``alpha`` (a string) and, with CV, ``cv_alphas``,
        ``cv_alphas_rule`` (:data:`CV_GRID_RULE`), ``cv_folds``, ``cv_columns`` (-1: all) and ``cv_seed``."""
        out = {"alpha": str(self.alpha)}
        if self.cv:
            out.update({"cv_alphas": np.asarray(self.cv_alphas), "cv_alphas_rule": CV_GRID_RULE,
                        "cv_folds": self.cv_folds, "cv_columns": -1 if self.cv_columns is None else self.cv_columns,
                        "cv_seed": self.cv_seed})
        return out
