"""Theory-of-Mind decoding (paper appendix J, figure 11).

In the ToM run each speaker states an emotion (8 words) and an action type (5 words) before its reply; the cube
holds, per utterance, the speaker's probability distribution over those words (``emotion_a`` etc.), which linear
probes decode from the ToM run's hidden states:

=================  ======================================  ======================================
relation           reader A: ``hidden_a_tom[k]`` (utt 2k)   reader B: ``hidden_b_tom[k]`` (utt 2k+1)
=================  ======================================  ======================================
self_current       ``emotion_a[k]``                         ``emotion_b[k]``
partner_previous   ``emotion_b[k-1]`` (k >= 1)              ``emotion_a[k]``
partner_next       ``emotion_b[k]``                         ``emotion_a[k+1]``
=================  ======================================  ======================================

(likewise for actions).  The partner's words are never in the reader's prompt.

Format filter (figure 11; the paper keeps models that follow the format): a sample is kept only if its *target*
utterance (the reader's own for ``self_current``, else the partner's) opened with "Emotion. Action type." as
instructed (``tom_format_a``/``tom_format_b`` = 1; counts in ``tom_n_kept``/``tom_n_dropped``).  A cube without
``tom_format_*`` is used whole, as is every sample with ``format_filter=False`` (models that never follow the
format, such as the tiny embedded ones, would leave nothing); attribute ``tom_format_filter`` says which.

Probe (ours; the paper gives none): ridge (:func:`synclib.analysis.ridge.ridge_solve`) from one layer's hidden state
to the centred log-probabilities, read out with a softmax; layer and penalty chosen on an episode-grouped validation
part (20 %) of the training set (per-layer test KL at each layer's validation-best penalty).  Metric: mean test
KL(true || predicted); baseline: KL(true || mean training distribution).  Splits: all samples by whole episodes with
the rule of :func:`synclib.splits.episode_split`, per split seed (the fixed 6,500 is the synchrony datasets').
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch
import xarray as xr
from tqdm import tqdm

from synclib.analysis.ridge import ridge_solve
from synclib.cube import HiddenRows, var_name
from synclib.splits import RidgeInputError, episode_split, validation_split
from synclib.stats import mean_se

__all__ = ["tom_dataset", "tom_decode", "kl_divergence", "ToMError", "TOM_RELATIONS", "TOM_TARGETS"]

TOM_RELATIONS = ("self_current", "partner_previous", "partner_next")
TOM_TARGETS = ("emotion", "action")
AGENTS = ("A", "B")
DEFAULT_TOM_ALPHAS = (1e-1, 1.0, 1e1, 1e2, 1e3, 1e4, 1e5)
_EPS = 1e-8
#: the dims of the per-probe results: target, relation, reader, split seed
_DIMS = ("tom_target", "tom_relation", "agent", "split_seed")


class ToMError(ValueError):
    """The cube lacks the ToM variables or an option is invalid."""


def kl_divergence(p, q) -> np.ndarray:
    """Row-wise KL(p || q) in nats, (n,): ``p`` (n, K) true distributions (0 log 0 = 0), ``q`` (n, K) or (1, K)
    predicted ones (clipped at 1e-8)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.clip(np.asarray(q, dtype=np.float64), _EPS, None)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(p > 0, p * (np.log(np.clip(p, _EPS, None)) - np.log(q)), 0.0)
    return t.sum(-1)


# --------------------------------------------------------------------------- samples
def _sides(agent: str) -> tuple[str, str]:
    """The reader's cube side and its partner's: ``"A"`` -> ``("a", "b")``."""
    if agent not in AGENTS:
        raise ToMError(f"agent must be one of {AGENTS}, got {agent!r}")
    return ("a", "b") if agent == "A" else ("b", "a")


def _check_vars(cube, agent: str, relation: str, target: str) -> tuple[str, str]:
    """Check the names and that the cube has the probe's variables; returns :func:`_sides`."""
    if relation not in TOM_RELATIONS:
        raise ToMError(f"relation must be one of {TOM_RELATIONS}, got {relation!r}")
    if target not in TOM_TARGETS:
        raise ToMError(f"target must be one of {TOM_TARGETS}, got {target!r}")
    me, other = _sides(agent)
    need = [var_name("hidden", me, "tom"), var_name(target, me, "tom"), var_name(target, other, "tom")]
    missing = [v for v in need if v not in cube.variables]
    if missing:
        raise ToMError(f"the cube has no ToM variable(s) {missing}; simulate with the ToM run enabled")
    return me, other


def _hidden(cube, agent: str, max_resident_bytes: int | None = None) -> HiddenRows:
    """The reader's ToM-run states, rows (E*S*R, L, D)."""
    return HiddenRows(cube[var_name("hidden", _sides(agent)[0], "tom")], max_resident_bytes)


def _tom_samples(cube, agent: str, relation: str, target: str, hidden: HiddenRows, format_filter: bool = True):
    """The samples of one probe (index arithmetic in the module doc): ``rows`` (n,) of ``hidden`` (flat (episode,
    sim_seed, round)), ``P`` (n, K) target distributions, ``episode`` (n,) and ``counts``: ``kept``/``dropped``
    (target utterance did / did not follow the format) and ``filtered`` (False: no ``tom_format_*`` in the cube or
    ``format_filter`` off, every sample used)."""
    me, other = _check_vars(cube, agent, relation, target)
    E, S, R = hidden.grid
    if relation == "self_current":
        side, shift = me, 0
    elif relation == "partner_previous":
        side, shift = other, (-1 if agent == "A" else 0)
    else:
        side, shift = other, (0 if agent == "A" else 1)
    P = np.asarray(cube[var_name(target, side, "tom")].values, dtype=np.float64)
    e, s, k = (g.ravel() for g in np.meshgrid(np.arange(E), np.arange(S), np.arange(R), indexing="ij"))
    kt = k + shift
    inside = (kt >= 0) & (kt < R)
    e, s, k, kt = e[inside], s[inside], k[inside], kt[inside]
    rows = (e * S + s) * R + k
    Pt = P[e, s, kt]
    keep = hidden.ok[rows] & np.isfinite(Pt).all(1)
    fmt = var_name("tom_format", side, "tom")
    has_format = fmt in cube.variables
    filtered = has_format and format_filter
    followed = np.asarray(cube[fmt].values)[e, s, kt] == 1 if has_format else np.ones(len(e), dtype=bool)
    counts = {"kept": int((keep & followed).sum()), "dropped": int((keep & ~followed).sum()), "filtered": filtered}
    if filtered:
        keep &= followed
    return rows[keep], Pt[keep], e[keep], counts


def tom_dataset(cube, agent: str, relation: str, target: str):
    """Samples for one probe after the format filter: ``X`` (n, L, D) the reader's hidden states (as stored),
    ``P`` (n, K) target distributions, ``episode`` (n,) each sample's episode position."""
    _check_vars(cube, agent, relation, target)
    hidden = _hidden(cube, agent)
    rows, P, ep, _ = _tom_samples(cube, agent, relation, target, hidden)
    return hidden[rows], P, ep


# --------------------------------------------------------------------------- probes
@dataclass
class _Probe:
    """One probe (target, relation, reader, split seed): samples, targets and split."""
    key: tuple          # (target, relation, agent, split seed) position in the result arrays
    rows: np.ndarray    # (n,) rows of the reader's HiddenRows
    P: np.ndarray       # (n, K) target distributions
    T: np.ndarray       # (n, K) regression targets: centred log-probabilities
    fit: np.ndarray     # sample indices fitted when choosing layer and alpha
    val: np.ndarray     # validation sample indices
    train: np.ndarray   # fit + val: fitted for the test score
    test: np.ndarray


@dataclass
class _Results:
    """The result arrays of :func:`tom_decode`; dims (T, R, A, S) = :data:`_DIMS`."""
    kl: np.ndarray          # (T, R, A, S, L) test KL per layer
    val_kl: np.ndarray      # (T, R, A, S, L, n_alpha) validation KL
    best: np.ndarray        # (T, R, A, S) test KL at the validation-chosen layer
    base: np.ndarray        # (T, R, A, S) baseline KL
    best_layer: np.ndarray  # (T, R, A, S) int, -1 where not fitted
    best_alpha: np.ndarray  # (T, R, A, S)
    n_train: np.ndarray     # (T, R, A, S) int
    n_test: np.ndarray      # (T, R, A, S) int
    n_kept: np.ndarray      # (T, R, A) int: samples whose target utterance followed the format
    n_dropped: np.ndarray   # (T, R, A) int: samples dropped because it did not
    filtered: bool = True   # False: no tom_format_* in the cube, or the filter is off (nothing dropped)
    has_format: bool = True  # the cube has tom_format_*

    @classmethod
    def empty(cls, n_layers: int, n_seeds: int, n_alphas: int) -> "_Results":
        shape = (len(TOM_TARGETS), len(TOM_RELATIONS), len(AGENTS), n_seeds)
        return cls(kl=np.full(shape + (n_layers,), np.nan), val_kl=np.full(shape + (n_layers, n_alphas), np.inf),
                   best=np.full(shape, np.nan), base=np.full(shape, np.nan),
                   best_layer=np.full(shape, -1, dtype=np.int64), best_alpha=np.full(shape, np.nan),
                   n_train=np.zeros(shape, dtype=np.int64), n_test=np.zeros(shape, dtype=np.int64),
                   n_kept=np.zeros(shape[:3], dtype=np.int64), n_dropped=np.zeros(shape[:3], dtype=np.int64))

    def choose(self, key: tuple, alphas) -> None:
        """Layer and alpha of probe ``key``: the lowest validation KL."""
        layer, j = np.unravel_index(int(np.argmin(self.val_kl[key])), self.val_kl[key].shape)
        self.best_layer[key] = layer
        self.best_alpha[key] = alphas[j]
        self.best[key] = self.kl[key + (layer,)]

    def to_dataset(self, seeds: list[int]) -> xr.Dataset:
        ds = xr.Dataset(
            {
                "tom_kl": (_DIMS + ("tom_layer",), self.kl),
                "tom_kl_best": (_DIMS, self.best),
                "tom_kl_baseline": (_DIMS, self.base),
                "tom_best_layer": (_DIMS, self.best_layer),
                "tom_best_alpha": (_DIMS, self.best_alpha),
                "tom_n_train": (_DIMS, self.n_train),
                "tom_n_test": (_DIMS, self.n_test),
                "tom_n_kept": (_DIMS[:3], self.n_kept),
                "tom_n_dropped": (_DIMS[:3], self.n_dropped),
            },
            coords={"tom_target": list(TOM_TARGETS), "tom_relation": list(TOM_RELATIONS),
                    "agent": list(AGENTS), "split_seed": seeds, "tom_layer": np.arange(self.kl.shape[-1])},
        )
        for name in ("tom_kl_best", "tom_kl_baseline"):
            m, se = mean_se(ds[name].values, axis=-1)  # over split seeds
            ds[f"{name}_mean"] = (_DIMS[:-1], m)
            ds[f"{name}_se"] = (_DIMS[:-1], se)
        ds.attrs["tom_format_filter"] = (
            "applied: samples whose target utterance did not open with 'Emotion. Action type.' "
            "(tom_format_* != 1) are dropped" if self.filtered else
            "not applied (format_filter=False): all samples used; tom_n_kept / tom_n_dropped count the "
            "samples whose target utterance did / did not follow the format" if self.has_format else
            "not applied: the cube has no tom_format_a/tom_format_b variables; all samples used")
        return ds


def _probe_split(ep: np.ndarray, seed: int, val_frac: float, test_frac: float):
    """``(fit, val, train, test)`` indices of one probe by whole episodes ``ep`` (n,): :func:`episode_split`, then
    the training set into fit and validation parts; None where a part would hold fewer than 2."""
    try:
        tr, te, _ = episode_split(ep, None, seed, train_frac=1 - test_frac)
        fit, val = validation_split(ep[tr], seed, val_frac)
    except RidgeInputError:  # too few samples or episodes
        return None
    fit, val = tr[fit], tr[val]
    return None if min(len(fit), len(val), len(te)) < 2 else (fit, val, tr, te)


def _reader_probes(cube, ai: int, hidden: HiddenRows, seeds, val_frac: float, test_frac: float,
                   res: _Results, bar, format_filter: bool = True) -> list[_Probe]:
    """Every probe of reader ``AGENTS[ai]`` with enough samples; records their sample
    counts and baselines in ``res`` (a probe without enough samples stays NaN)."""
    agent = AGENTS[ai]
    probes = []
    for ti, target in enumerate(TOM_TARGETS):
        for ri, rel in enumerate(TOM_RELATIONS):
            rows, P, ep, counts = _tom_samples(cube, agent, rel, target, hidden, format_filter)
            res.has_format = res.has_format and var_name("tom_format", _sides(agent)[0], "tom") in cube.variables
            res.n_kept[ti, ri, ai], res.n_dropped[ti, ri, ai] = counts["kept"], counts["dropped"]
            res.filtered = res.filtered and counts["filtered"]
            T = np.log(np.clip(P, _EPS, None))
            T -= T.mean(1, keepdims=True)
            for si, seed in enumerate(seeds):
                split = _probe_split(ep, seed, val_frac, test_frac)
                if split is None:
                    bar.update(hidden.shape[1])
                    continue
                fit, val, tr, te = split
                res.n_train[ti, ri, ai, si], res.n_test[ti, ri, ai, si] = len(tr), len(te)
                res.base[ti, ri, ai, si] = kl_divergence(P[te], P[tr].mean(0)[None]).mean()
                probes.append(_Probe((ti, ri, ai, si), rows, P, T, fit, val, tr, te))
    return probes


def _probe_kl(logits: torch.Tensor, P: np.ndarray) -> float:
    """Mean KL(P || softmax(logits)); logits and P (n, K)."""
    q = torch.softmax(logits, -1).cpu().numpy()
    return float(kl_divergence(P, q).mean())


def _probe_layer(Xl: torch.Tensor, layer: int, p: _Probe, alphas, res: _Results) -> None:
    """Probe ``p`` on one layer (Xl (n, D) float64): validation KL for every alpha, then
    the test KL of the training-set fit at the validation-best alpha."""
    T = torch.as_tensor(p.T, device=Xl.device)
    for j, a in enumerate(alphas):
        pred = ridge_solve(Xl[p.fit], Xl[p.val], a, T[p.fit])
        res.val_kl[p.key + (layer, j)] = _probe_kl(pred, p.P[p.val])
    j = int(np.argmin(res.val_kl[p.key + (layer,)]))
    pred = ridge_solve(Xl[p.train], Xl[p.test], alphas[j], T[p.train])
    res.kl[p.key + (layer,)] = _probe_kl(pred, p.P[p.test])


def _fit_probes(hidden: HiddenRows, probes: list[_Probe], alphas, dev, res: _Results, bar) -> None:
    """Every probe of one reader on every layer, the states read in blocks of layers within the resident budget."""
    La = hidden.shape[1]
    used = np.unique(np.concatenate([p.rows for p in probes]))
    row_bytes = hidden.shape[2] * hidden.dtype.itemsize * len(used)
    block = La if hidden.resident else max(1, hidden.max_resident_bytes // max(row_bytes, 1))
    for l0 in range(0, La, block):
        Xb = hidden[used, slice(l0, min(La, l0 + block))]  # (len(used), block, D)
        for p in probes:
            pos = np.searchsorted(used, p.rows)
            for j0 in range(Xb.shape[1]):
                Xl = torch.as_tensor(Xb[pos, j0], dtype=torch.float64, device=dev)
                _probe_layer(Xl, l0 + j0, p, alphas, res)
                bar.update(1)
        del Xb
    for p in probes:
        res.choose(p.key, alphas)


def tom_decode(cube, split_seeds=(0, 1, 2), *, alphas=DEFAULT_TOM_ALPHAS, val_frac: float = 0.2,
               test_frac: float = 0.2, device=None, max_resident_bytes: int | None = None,
               progress: bool = False, format_filter: bool = True) -> xr.Dataset:
    """ToM decoding for both readers, three relations, emotions and actions (module doc).

    Parameters
    ----------
    cube : xarray.Dataset
        With the ToM variables (``hidden_*_tom``, ``emotion_*``, ``action_*``).
    split_seeds : sequence of int
    alphas : sequence of float
        Ridge penalties searched (with the layer) on the validation part.
    val_frac, test_frac : float
        Share of the training samples in the validation part, of all samples in the test set (whole episodes).
    device : torch device of the probes (default CPU).
    max_resident_bytes : int, optional
        A reader's states up to this size are loaded whole, larger ones (lazily opened cubes) read in blocks of
        layers of about this size (:class:`synclib.cube.HiddenRows`).
    progress : bool
        A tqdm bar on stderr.
    format_filter : bool
        Drop samples whose target utterance did not follow the format (module doc).

    Returns
    -------
    xarray.Dataset
        With T, R, A, S = tom_target, tom_relation, agent, split_seed: ``tom_kl`` (T, R, A, S, tom_layer),
        ``tom_kl_best``, ``tom_kl_baseline``, ``tom_best_layer``, ``tom_best_alpha`` (T, R, A, S),
        ``tom_kl_best_mean``/``_se`` and ``tom_kl_baseline_mean``/``_se`` (T, R, A; :func:`synclib.stats.mean_se`
        over split seeds), ``tom_n_train``, ``tom_n_test`` (T, R, A, S: emotions and actions have their own
        samples, an action distribution existing only where the reply generated a token holding a '.'),
        ``tom_n_kept``, ``tom_n_dropped`` (T, R, A), attribute ``tom_format_filter``.

    Raises
    ------
    ToMError
        the cube lacks the ToM variables.
    RidgeInputError
        too few samples (episodes) to split.
    """
    dev = torch.device(device or "cpu")
    seeds = [int(s) for s in split_seeds]
    n_layers = {"A": cube.sizes["layer_a"], "B": cube.sizes["layer_b"]}
    res = _Results.empty(max(n_layers.values()), len(seeds), len(alphas))
    bar = tqdm(total=len(TOM_TARGETS) * len(TOM_RELATIONS) * len(seeds) * sum(n_layers.values()),
               desc="ToM probes", disable=None if progress else True, file=sys.stderr)
    for ai, agent in enumerate(AGENTS):
        for target in TOM_TARGETS:  # before reading anything
            _check_vars(cube, agent, TOM_RELATIONS[0], target)
        hidden = _hidden(cube, agent, max_resident_bytes)
        probes = _reader_probes(cube, ai, hidden, seeds, val_frac, test_frac, res, bar, format_filter)
        if probes:
            _fit_probes(hidden, probes, alphas, dev, res, bar)
    bar.close()
    return res.to_dataset(seeds)
