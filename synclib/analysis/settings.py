""":class:`AnalysisSettings`: the options of :func:`~synclib.analysis.analyze` as one frozen object, checked when
made (errors name the field and any config key), and :meth:`AnalysisSettings.from_config`, the mapping from a run
config that the main job (:func:`synclib.run.pipeline.step_analyze`) and ``synclib analyze`` share."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import ClassVar

from synclib.analysis.mlp import MLPOptions
from synclib.analysis.samples import DEFAULT_CONDITIONS, DIRECTIONS, AnalysisError, parse_condition
from synclib.keys import Settings, default, int_list, integer, optional
from synclib.penalty import FIELDS as PENALTY_FIELDS, Penalty

__all__ = ["AnalysisSettings"]


def _set(obj, name: str, value) -> None:
    object.__setattr__(obj, name, value)


@dataclass(frozen=True)
class AnalysisSettings(Settings):
    """What :func:`~synclib.analysis.analyze` computes and how (everything but the cube).

    The fields in ``KEYS`` are the ``analysis.*`` keys of that name (the key's rule and default), except that the
    optional blocks ``persona_disjoint``, ``relationship``, ``nonlinear``, ``tom`` (off) and ``surrogates``,
    ``planted`` (0), on in a run config and in ``synclib analyze``, are off in a bare library call.  The blocks
    after the conditions (``persona_disjoint`` to ``planted``) need ``genuine``.

    Attributes
    ----------
    conditions : among ``genuine``, ``passive`` (needs the passive variables), ``shuffled`` (genuine samples,
        training targets permuted within each dialog), ``pseudo`` (ours,
        :func:`synclib.analysis.samples.pseudo_partners`), ``lagJ``; those whose variables are missing are skipped
        with a note.  From a config: all, ``pseudo`` where ``analysis.pseudo_dyads``.
    penalty : :class:`synclib.penalty.Penalty` (or a number > 0 or ``"cv"``); fields ``analysis.alpha`` and
        ``analysis.cv_*``.  With another than the paper's, genuine is also fitted at the paper's (figure 8).
    n_samples : fixed sample size per dataset (:func:`synclib.splits.episode_split`); None: all.
    split_seeds : train/test split seeds.
    lags : ``lagJ`` for each J replaces the lag conditions of ``conditions``; None: the conditions as given.
    device, precision : the ridge grids' (:class:`synclib.analysis.ridge.ComputeOptions`); from a config,
        ``device`` (``auto``: None, the inputs' device).
    directions : among ``A->B``, ``B->A``.
    persona_disjoint : also genuine on a persona-disjoint split (table 2).
    relationship, relationship_seeds, relationship_min : also appendix G, its subsampling seeds, and the fewest
        test samples a relationship needs (fewer: NaN).
    sample_sizes : also appendix D at these sample sizes (None: none).
    nonlinear, nonlinear_pairs, nonlinear_options, nonlinear_seeds : also appendix I on ``nonlinear_pairs``
        ((src, tgt) layer pairs per direction; default: chosen per split,
        :func:`synclib.analysis.blocks.nonlinear_block`), with :class:`~synclib.analysis.mlp.MLPOptions` (or a dict
        of its fields), on the first ``nonlinear_seeds`` split seeds (None: all).
    tom, tom_options : also appendix J, with other keywords of :func:`synclib.analysis.tom.tom_decode`; from a
        config where ``analysis.tom`` and ``simulate.tom`` are on, ``format_filter`` from
        ``analysis.tom_format_filter``.
    n_boot : resamples of whole episodes for the dialog-level tests (``sync_r2_boot``); 0: none.
    cka : also linear CKA of every layer pair on each condition's dataset.
    surrogates, planted : also this many surrogate partners per dialog (:mod:`synclib.analysis.surrogates`) and
        replicates with planted differences (:mod:`synclib.analysis.planted`); 0: none.
    max_resident_bytes : hidden-state variables up to this size are loaded whole, larger ones of a lazily opened
        cube streamed (:class:`synclib.cube.HiddenRows`); None: ``synclib.cube.DEFAULT_RESIDENT_BYTES``; from a
        config, ``analysis.max_resident_gib``.
    """

    KEYS: ClassVar[dict[str, str]] = {n: f"analysis.{n}" for n in (
        "n_samples", "split_seeds", "lags", "precision", "persona_disjoint", "relationship", "sample_sizes",
        "nonlinear", "nonlinear_seeds", "tom", "n_boot", "surrogates", "planted")}
    UNSET: ClassVar[tuple[str, ...]] = ("lags",)
    ERROR: ClassVar[type[Exception]] = AnalysisError

    conditions: tuple = DEFAULT_CONDITIONS
    penalty: Penalty = Penalty()
    n_samples: int | None = default("analysis.n_samples")
    split_seeds: tuple = tuple(default("analysis.split_seeds"))
    lags: tuple | None = None
    device: object = None
    precision: str = default("analysis.precision")
    directions: tuple = DIRECTIONS
    persona_disjoint: bool = False
    relationship: bool = False
    relationship_seeds: tuple = (0, 1, 2)
    relationship_min: int = 10
    sample_sizes: tuple | None = default("analysis.sample_sizes")
    nonlinear: bool = False
    nonlinear_pairs: object = None
    nonlinear_options: MLPOptions = MLPOptions()
    nonlinear_seeds: int | None = default("analysis.nonlinear_seeds")
    tom: bool = False
    tom_options: dict | None = None
    n_boot: int = default("analysis.n_boot")
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
        self._check_own(relationship_seeds=int_list(0), relationship_min=integer(0),
                        max_resident_bytes=optional(integer(0)))
        if isinstance(self.conditions, str):
            raise AnalysisError(f"conditions must be a sequence of condition names, got {self.conditions!r}")
        _set(self, "conditions", tuple(self.conditions))
        self.all_conditions()  # checks every condition
        _set(self, "directions", tuple(self.directions))
        for d in self.directions:
            if d not in DIRECTIONS:
                raise AnalysisError(f"directions: unknown direction {d!r}")
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
        """A copy with ``options`` (fields) changed, checked again; the penalty may also be given by its fields
        (:data:`synclib.penalty.FIELDS`), each changing only that field, and ``nonlinear_options`` by a dict of
        the fields to change."""
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
        """The settings of a run config (:func:`synclib.config.load_config`): the fields in
        ``KEYS`` from their keys, and the few that other keys make (see the attributes)."""
        ana = cfg["analysis"]
        device = cfg.get("device")
        return super().from_config(
            cfg, conditions=tuple(c for c in DEFAULT_CONDITIONS if ana["pseudo_dyads"] or c != "pseudo"),
            penalty=Penalty(**{f: ana[f] for f in PENALTY_FIELDS}), nonlinear_options=MLPOptions.from_config(cfg),
            tom=bool(ana["tom"] and cfg.get("simulate", {}).get("tom", True)),
            tom_options={"format_filter": ana["tom_format_filter"]},
            max_resident_bytes=int(ana["max_resident_gib"] * 2**30),
            device=None if device in (None, "auto") else device)


def _fields(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}
