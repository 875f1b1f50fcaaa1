"""The ridge penalty as one object: :class:`Penalty`, a fixed ``alpha`` or one chosen by
episode-grouped cross-validation, validated once.

The config (``analysis.alpha`` and ``analysis.cv_*``), the command line (``--alpha``,
:func:`synclib.argtypes.ridge_alpha`), :func:`synclib.analysis.analyze` and
:func:`synclib.analysis.ridge.r2_grid` all read a penalty through :meth:`Penalty.parse` /
:meth:`Penalty.of`, so the check "a number > 0 or ``"cv"``" lives here only.  An analysis
records its penalty in its attributes (:meth:`Penalty.attrs`) and :meth:`Penalty.from_attrs`
reads it back.  numpy only (no torch): the config and the command lines import it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from synclib.splits import RidgeInputError

__all__ = ["Penalty", "PAPER_ALPHA", "DEFAULT_CV_ALPHAS", "CV_GRID_RULE", "KINDS", "FIELD_RULES",
           "check_alpha_value", "check_alphas", "check_folds", "check_columns", "check_seed"]

#: the paper's ridge penalty (``Ridge(alpha=0.1)``, ``affine_transformation.py``)
PAPER_ALPHA = 0.1
#: the log grid searched by ``alpha="cv"``, relative to each source layer's scale
#: (:func:`synclib.analysis.ridge.layer_scale`): 1e-3 ... 1e3 of it, half decades (the embedded runs choose 0.3-10)
DEFAULT_CV_ALPHAS = tuple(float(a) for a in np.logspace(-3, 3, 13))
CV_GRID_RULE = ("ours: alpha='cv' searches cv_alphas times each source layer's scale, the mean non-zero "
                "eigenvalue of Xc'Xc on the training rows (synclib.analysis.ridge.layer_scale: trace / min(n_train - 1, D)), "
                "so that one grid serves layers whose feature variances differ by orders of magnitude; the "
                "estimator stays the plain ridge of the raw features. A fixed alpha (the paper's 0.1) is used as "
                "it is.")
#: the kinds of penalty: a fixed ``alpha``, or one chosen per source layer by grouped CV
KINDS = ("fixed", "cv")
#: what each field (and its config key ``analysis.alpha`` / ``analysis.cv_*``) allows
FIELD_RULES = {"alpha": "a number > 0 or 'cv'", "alphas": "a non-empty list of numbers > 0",
               "folds": "an integer >= 2", "columns": "null or an integer >= 1", "seed": "an integer >= 0"}


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_pos(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) \
        and math.isfinite(float(v)) and float(v) > 0


def check_alpha_value(value):
    """``value`` as the config writes a penalty: ``"cv"`` or a number > 0 (returned as it is).

    Raises
    ------
    RidgeInputError
        naming ``alpha``."""
    if value == "cv" if isinstance(value, str) else _is_pos(value):
        return value
    raise RidgeInputError(f"alpha must be {FIELD_RULES['alpha']}, got {value!r}")


def check_alphas(value) -> tuple:
    """The CV grid as a tuple of floats (multiples of each layer's scale)."""
    items = list(value) if isinstance(value, (list, tuple, np.ndarray)) else None
    if not items or not all(_is_pos(a) for a in items):
        raise RidgeInputError(f"alphas (the CV grid) must be {FIELD_RULES['alphas']}, got {value!r}")
    return tuple(float(a) for a in items)


def check_folds(value) -> int:
    if not _is_int(value) or value < 2:
        raise RidgeInputError(f"folds (the CV folds) must be {FIELD_RULES['folds']}, got {value!r}")
    return int(value)


def check_columns(value):
    if value is not None and (not _is_int(value) or value < 1):
        raise RidgeInputError(f"columns (target columns per layer of the CV criterion) must be "
                              f"{FIELD_RULES['columns']}, got {value!r}")
    return None if value is None else int(value)


def check_seed(value) -> int:
    if not _is_int(value) or value < 0:
        raise RidgeInputError(f"seed (of the CV folds and columns) must be {FIELD_RULES['seed']}, got {value!r}")
    return int(value)


def _fixed_alpha(value):
    """A fixed penalty: a float > 0, or a 1-D sequence (one per source layer) as a tuple of them."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
        if items and all(_is_pos(x) for x in items):
            return tuple(float(x) for x in items)
    elif _is_pos(value):
        return float(value)
    raise RidgeInputError(f"alpha must be a positive number, an array of them or 'cv', got {value!r}")


@dataclass(frozen=True)
class Penalty:
    """The ridge penalty of a fit, checked once (errors name the field).

    Parameters
    ----------
    kind : {"fixed", "cv"}
        ``"fixed"``: ``alpha`` for every map.  ``"cv"``: each source layer's penalty chosen
        from ``alphas`` times the layer's scale (:data:`CV_GRID_RULE`) by ``folds``-fold CV
        over whole groups (episodes) of the training rows (:func:`synclib.analysis.ridge.r2_grid`).
    alpha : float > 0 or tuple (L_src,) of them
        The fixed penalty (one per source layer when a tuple, e.g. those a CV fit chose);
        None with ``kind="cv"``.
    alphas : tuple of float > 0
        The CV grid, relative to each source layer's scale (:data:`DEFAULT_CV_ALPHAS`).
    folds : int >= 2
        CV folds.
    columns : int >= 1 or None
        Target columns per target layer used by the CV criterion (a fixed random subset;
        None: all).
    seed : int >= 0
        Seed of the folds and of the columns' subset.
    """

    kind: str = "fixed"
    alpha: float | tuple | None = PAPER_ALPHA
    alphas: tuple = DEFAULT_CV_ALPHAS
    folds: int = 3
    columns: int | None = 32
    seed: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise RidgeInputError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "cv" and self.alpha is not None:
            raise RidgeInputError(f"alpha must be None with kind='cv' (the CV chooses it), got {self.alpha!r}")
        object.__setattr__(self, "alpha", None if self.kind == "cv" else _fixed_alpha(self.alpha))
        object.__setattr__(self, "alphas", check_alphas(self.alphas))
        object.__setattr__(self, "folds", check_folds(self.folds))
        object.__setattr__(self, "columns", check_columns(self.columns))
        object.__setattr__(self, "seed", check_seed(self.seed))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def parse(cls, value, *, alphas=DEFAULT_CV_ALPHAS, folds: int = 3, columns: int | None = 32,
              seed: int = 0) -> "Penalty":
        """The penalty of a config value (``analysis.alpha``: a number > 0 or ``"cv"``, checked
        by :func:`check_alpha_value`), with the CV grid, folds, columns and seed
        (``analysis.cv_*``)."""
        value = check_alpha_value(value)
        cv = value == "cv"
        return cls("cv" if cv else "fixed", None if cv else value, alphas, folds, columns, seed)

    @classmethod
    def of(cls, value) -> "Penalty":
        """``value`` as a Penalty: a Penalty as it is, ``"cv"`` (the default CV), or a fixed
        penalty (a number > 0 or an (L_src,) array of them)."""
        if isinstance(value, Penalty):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        return cls("fixed", value)

    @classmethod
    def from_attrs(cls, attrs) -> "Penalty":
        """The penalty an analysis recorded (:meth:`attrs`); older files: from ``alpha`` alone."""
        alpha = str(attrs.get("alpha", PAPER_ALPHA))
        kind = str(attrs.get("penalty_kind", "cv" if alpha == "cv" else "fixed"))
        if kind != "cv":
            return cls.parse(float(alpha))
        columns = int(attrs.get("penalty_columns", 32))
        return cls("cv", None, tuple(np.atleast_1d(attrs.get("alpha_grid", DEFAULT_CV_ALPHAS)).tolist()),
                   int(attrs.get("penalty_folds", 3)), None if columns < 0 else columns,
                   int(attrs.get("penalty_seed", 0)))

    # ------------------------------------------------------------------ reading it
    @property
    def cv(self) -> bool:
        """True where the penalty is chosen by cross-validation."""
        return self.kind == "cv"

    @property
    def value(self):
        """The config's form: ``"cv"`` or the fixed alpha."""
        return "cv" if self.cv else self.alpha

    def is_paper(self) -> bool:
        """A fixed penalty equal to the paper's (:data:`PAPER_ALPHA`) for every map."""
        return not self.cv and bool(np.allclose(self.alpha, PAPER_ALPHA))

    def label(self) -> str:
        """In words: ``"λ = 0.1"`` or ``"λ chosen by cross-validation"``."""
        return "λ chosen by cross-validation" if self.cv else f"λ = {self.alpha}"

    def attrs(self) -> dict:
        """What an analysis records (netCDF attributes: str, int or float arrays):
        ``alpha`` (the config's form), ``penalty_kind`` and, with CV, ``alpha_grid``,
        ``alpha_grid_rule``, ``penalty_folds``, ``penalty_columns`` (-1: all) and ``penalty_seed``."""
        out = {"alpha": str(self.value), "penalty_kind": self.kind}
        if self.cv:
            out.update({"alpha_grid": np.asarray(self.alphas), "alpha_grid_rule": CV_GRID_RULE,
                        "penalty_folds": self.folds, "penalty_columns": -1 if self.columns is None else self.columns,
                        "penalty_seed": self.seed})
        return out
