""":class:`AnalysisSettings`: the options of :func:`~synclib.analysis.analyze` as one frozen
object, checked once (errors name the field), and :meth:`AnalysisSettings.from_config`, the one
mapping from a run config (:func:`synclib.config.load_config`) to them: the main job
(:func:`synclib.run.pipeline.step_analyze`) and ``synclib analyze --config`` both use it."""
from __future__ import annotations

import numbers
from dataclasses import dataclass, fields, replace
from typing import ClassVar

from synclib.analysis.blocks import N_BOOT
from synclib.analysis.mlp import MLPOptions
from synclib.analysis.samples import DEFAULT_CONDITIONS, DIRECTIONS, AnalysisError, parse_condition
from synclib.keys import Settings
from synclib.penalty import FIELDS as PENALTY_FIELDS, Penalty

__all__ = ["AnalysisSettings"]


def _int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _ints(name: str, v, lo: int, nonempty: bool = True) -> tuple:
    """``v`` as a tuple of integers >= ``lo`` (an error naming ``name`` otherwise)."""
    try:
        out = tuple(v)
    except TypeError:
        out = None
    if out is None or (nonempty and not out) or not all(_int(x) and x >= lo for x in out):
        raise AnalysisError(f"{name} must be a {'non-empty ' if nonempty else ''}sequence of integers >= {lo}, "
                            f"got {v!r}")
    return tuple(int(x) for x in out)


def _set(obj, name: str, value) -> None:
    object.__setattr__(obj, name, value)


@dataclass(frozen=True)
class AnalysisSettings(Settings):
    """What :func:`~synclib.analysis.analyze` computes and how (everything but the cube).

    The fields in ``KEYS`` are ``analysis.*`` keys of the run config, checked by their keys'
    rules (:class:`synclib.keys.Settings`); their defaults here are the protocol's and the
    optional blocks off (``n_samples`` 6,500, split seeds 0-2), the run config's are ours.

    Attributes
    ----------
    conditions : among ``genuine``, ``passive`` (needs the passive variables),
        ``shuffled`` (the reference's shuffled control: genuine samples, training
        targets permuted within each dialog), ``pseudo`` (ours: pseudo-dyads, the partner's
        states from a dialog the source agent did not take part in,
        :func:`synclib.analysis.samples.pseudo_partners`), ``lagJ``.  Conditions whose
        variables are missing are skipped with a note.
    penalty : :class:`synclib.penalty.Penalty` (or what :meth:`~synclib.penalty.Penalty.of`
        takes: a number > 0 or ``"cv"``), whose fields are the config's ``analysis.alpha`` and
        ``analysis.cv_*``.  With CV (episode-grouped, on each training set)
        the chosen penalties are in ``alpha``.  With a penalty other than the paper's
        (:data:`synclib.penalty.PAPER_ALPHA`) the genuine condition is also fitted at the
        paper's (``paper_alpha_*``, figure 8).
    n_samples : fixed sample size ``N`` per dataset (protocol: 6,500), split by the
        reference's rule (:func:`synclib.splits.episode_split`; fewer available: the test
        set takes ``>= N - int(0.8 N)`` and training all the rest); ``None`` = all.
    split_seeds : split seeds (protocol: 0, 1, 2), integers in 0 .. 2**32-1.
    lags : convenience: ``lagJ`` for each J replaces the lag conditions of ``conditions``.
    device, precision : the ridge grids' (:class:`synclib.analysis.ridge.ComputeOptions`).
    directions : among ``A->B``, ``B->A``.
    persona_disjoint : also the genuine condition with a persona-disjoint split (table 2).
    relationship : also appendix G (genuine condition, test subsets by relationship).
    relationship_seeds : subsampling seeds of appendix G.
    relationship_min : relationships with fewer test samples are left out (NaN).
    sample_sizes : also appendix D: genuine SyncR^2 at these sample sizes (None: none).
    nonlinear : also appendix I (MLP) on ``nonlinear_pairs`` ((src, tgt) layer pairs per
        direction; default: each of 4 evenly spaced source layers with the target layer its
        affine map predicts best on a validation part of each split's training set,
        :func:`synclib.analysis.blocks.nonlinear_block`).
    nonlinear_options : :class:`synclib.analysis.mlp.MLPOptions` (or a dict of its fields).
    nonlinear_seeds : fit the MLPs on the first this many split seeds only (the others'
        ``nonlinear_r2`` and ``affine_r2`` are NaN); None: all.
    tom, tom_options : also appendix J (other keywords of :func:`synclib.analysis.tom.tom_decode`).
    n_boot : resamples of whole episodes for the dialog-level tests (``sync_r2_boot``,
        :func:`synclib.analysis.blocks.episode_bootstrap`); 0: none.
    cka : also linear CKA of every layer pair on all samples of each condition's dataset.
    surrogates : also genuine against this many surrogate partners per dialog (ours,
        :mod:`synclib.analysis.surrogates`); 0: none.  Needs the genuine condition.
    planted : also this many replicates of genuine against controls with planted differences
        (ours, :mod:`synclib.analysis.planted`: the power page's curve); 0: none.  Needs the
        genuine condition.
    max_resident_bytes : hidden-state variables up to this size (default
        ``synclib.cube.DEFAULT_RESIDENT_BYTES``, 2 GiB) are loaded whole; larger ones of a
        lazily opened cube stream from disk (:class:`synclib.cube.HiddenRows`).
    """

    KEYS: ClassVar[dict[str, str]] = {n: f"analysis.{n}" for n in (
        "n_samples", "split_seeds", "lags", "precision", "persona_disjoint", "relationship", "sample_sizes",
        "nonlinear", "nonlinear_seeds", "tom", "n_boot", "surrogates", "planted")}
    UNSET: ClassVar[tuple[str, ...]] = ("lags",)
    ERROR: ClassVar[type[Exception]] = AnalysisError

    conditions: tuple = DEFAULT_CONDITIONS
    penalty: Penalty = Penalty()
    n_samples: int | None = 6500
    split_seeds: tuple = (0, 1, 2)
    lags: tuple | None = None
    device: object = None
    precision: str = "float32"
    directions: tuple = DIRECTIONS
    persona_disjoint: bool = False
    relationship: bool = False
    relationship_seeds: tuple = (0, 1, 2)
    relationship_min: int = 10
    sample_sizes: tuple | None = None
    nonlinear: bool = False
    nonlinear_pairs: object = None
    nonlinear_options: MLPOptions = MLPOptions()
    nonlinear_seeds: int | None = None
    tom: bool = False
    tom_options: dict | None = None
    n_boot: int = N_BOOT
    cka: bool = True
    surrogates: int = 0
    planted: int = 0
    max_resident_bytes: int | None = None

    def __post_init__(self):
        _set(self, "penalty", Penalty.of(self.penalty))
        _set(self, "nonlinear_options", MLPOptions.of(self.nonlinear_options))
        if self.sample_sizes is not None and not len(self.sample_sizes):
            _set(self, "sample_sizes", None)
        self._check()
        if isinstance(self.conditions, str):
            raise AnalysisError(f"conditions must be a sequence of condition names, got {self.conditions!r}")
        _set(self, "conditions", tuple(self.conditions))
        self.all_conditions()  # checks every condition
        _set(self, "directions", tuple(self.directions))
        for d in self.directions:
            if d not in DIRECTIONS:
                raise AnalysisError(f"directions: unknown direction {d!r}")
        _set(self, "relationship_seeds", _ints("relationship_seeds", self.relationship_seeds, 0))
        if not _int(self.relationship_min) or self.relationship_min < 0:
            raise AnalysisError(f"relationship_min must be an integer >= 0, got {self.relationship_min!r}")
        v = self.max_resident_bytes
        if v is not None and not (_int(v) and v >= 0):
            raise AnalysisError(f"max_resident_bytes must be None or an integer >= 0, got {v!r}")
        if self.tom_options is not None and not isinstance(self.tom_options, dict):
            raise AnalysisError(f"tom_options must be None or a dict, got {self.tom_options!r}")
        if self.needs_genuine() and "genuine" not in self.all_conditions():
            raise AnalysisError("persona_disjoint / relationship / sample_sizes / nonlinear / surrogates / planted "
                                "need the 'genuine' condition")

    def all_conditions(self) -> list:
        """The conditions to analyse: ``conditions`` with ``lags`` replacing its lag conditions."""
        conditions = list(self.conditions)
        if self.lags is not None:
            conditions = [c for c in conditions if not c.startswith("lag")] + [f"lag{int(j)}" for j in self.lags]
        for c in conditions:
            parse_condition(c)
        if not conditions:
            raise AnalysisError("conditions: nothing to analyse")
        return conditions

    def needs_genuine(self) -> bool:
        """Whether an appendix block that re-uses the genuine fits is asked for."""
        return bool(self.persona_disjoint or self.relationship or self.sample_sizes or self.nonlinear
                    or self.surrogates or self.planted)

    def replace(self, **options) -> "AnalysisSettings":
        """A copy with ``options`` (fields) changed, checked again.  The penalty may also be
        given by its fields (:data:`synclib.penalty.FIELDS`: ``alpha``, ``cv_alphas``,
        ``cv_folds``, ``cv_columns``, ``cv_seed``, the config's keys), each changing only that
        field of ``penalty``; ``nonlinear_options`` may be a dict of the fields to change."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(options) - known - set(PENALTY_FIELDS))
        if unknown:
            raise TypeError(f"unknown analysis option(s) {unknown}; known: {sorted(known | set(PENALTY_FIELDS))}")
        parts = {k: options.pop(k) for k in list(options) if k in PENALTY_FIELDS}
        if parts:
            options["penalty"] = replace(Penalty.of(options.get("penalty", self.penalty)), **parts)
        if isinstance(options.get("nonlinear_options"), dict):
            options["nonlinear_options"] = MLPOptions.of({**_fields(self.nonlinear_options),
                                                          **options["nonlinear_options"]})
        return replace(self, **options)

    @classmethod
    def from_config(cls, cfg: dict) -> "AnalysisSettings":
        """THE mapping from a run config (:func:`synclib.config.load_config`: ``analysis.*``, the
        top-level ``device`` and ``simulate.tom``) to the analysis' settings.  The conditions are
        :data:`~synclib.analysis.samples.DEFAULT_CONDITIONS` (without ``pseudo`` unless
        ``analysis.pseudo_dyads``) with ``analysis.lags``; ToM runs where both ``analysis.tom`` and
        ``simulate.tom`` are on."""
        ana = cfg["analysis"]
        device = cfg.get("device")
        return cls(
            conditions=tuple(c for c in DEFAULT_CONDITIONS if ana["pseudo_dyads"] or c != "pseudo"),
            penalty=Penalty(**{f: ana[f] for f in PENALTY_FIELDS}),
            n_samples=ana["n_samples"], split_seeds=tuple(ana["split_seeds"]), lags=tuple(ana["lags"]),
            device=None if device in (None, "auto") else device, precision=ana["precision"],
            persona_disjoint=ana["persona_disjoint"], relationship=ana["relationship"],
            sample_sizes=tuple(ana["sample_sizes"]) if ana["sample_sizes"] else None, nonlinear=ana["nonlinear"],
            nonlinear_options=MLPOptions.from_config(cfg),
            nonlinear_seeds=ana["nonlinear_seeds"], tom=bool(ana["tom"] and cfg.get("simulate", {}).get("tom", True)),
            tom_options={"format_filter": ana["tom_format_filter"]}, n_boot=ana["n_boot"],
            surrogates=ana["surrogates"], planted=ana["planted"],
            max_resident_bytes=int(ana["max_resident_gib"] * 2**30))


def _fields(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}
