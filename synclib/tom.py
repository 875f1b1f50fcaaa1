"""Theory-of-Mind decoding (paper appendix J, figure 11).

In the ToM run each speaker states an emotion (8 words) and an action type (5
words) before its reply; the cube holds, per utterance, the speaker's
probability distribution over those words (``emotion_a`` etc.).  We decode these
distributions from hidden states of the ToM run with linear probes:

=================  ======================================  ======================================
relation           reader A: ``hidden_a_tom[k]`` (utt 2k)   reader B: ``hidden_b_tom[k]`` (utt 2k+1)
=================  ======================================  ======================================
self_current       ``emotion_a[k]``                         ``emotion_b[k]``
partner_previous   ``emotion_b[k-1]`` (k >= 1)              ``emotion_a[k]``
partner_next       ``emotion_b[k]``                         ``emotion_a[k+1]``
=================  ======================================  ======================================

(likewise for actions).  The partner's words are never in the reader's prompt.

Probe (our choice; the paper does not give one): ridge regression from one
layer's hidden state to the centred log-probabilities, read out with a softmax.
Layer and penalty are chosen on an episode-grouped validation part (20 %) of the
training set; the per-layer test KL is also reported (at each layer's validation-
best penalty).  Metric: mean test KL(true || predicted); baseline: KL(true ||
mean training distribution).  Splits: all samples, 80/20 by episodes, per split
seed (the protocol's fixed 6,500 applies to the synchrony datasets, not here).
"""
from __future__ import annotations

import sys

import numpy as np
import torch

__all__ = ["tom_dataset", "tom_decode", "kl_divergence", "TOM_RELATIONS", "TOM_TARGETS"]

TOM_RELATIONS = ("self_current", "partner_previous", "partner_next")
TOM_TARGETS = ("emotion", "action")
AGENTS = ("A", "B")
DEFAULT_TOM_ALPHAS = (1e-1, 1.0, 1e1, 1e2, 1e3, 1e4, 1e5)
_EPS = 1e-8


class ToMError(ValueError):
    """The cube lacks the ToM variables or an option is invalid."""


def kl_divergence(p, q) -> np.ndarray:
    """Row-wise KL(p || q) in nats for (n, K) distributions (0 log 0 = 0)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.clip(np.asarray(q, dtype=np.float64), _EPS, None)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(p > 0, p * (np.log(np.clip(p, _EPS, None)) - np.log(q)), 0.0)
    return t.sum(-1)


def _check_vars(cube, agent, relation, target):
    if agent not in AGENTS or relation not in TOM_RELATIONS or target not in TOM_TARGETS:
        raise ToMError(f"unknown agent/relation/target {agent!r}/{relation!r}/{target!r}")
    me, other = ("a", "b") if agent == "A" else ("b", "a")
    need = [f"hidden_{me}_tom", f"{target}_{me}", f"{target}_{other}"]
    missing = [v for v in need if v not in cube.variables]
    if missing:
        raise ToMError(f"the cube has no ToM variable(s) {missing}; simulate with the ToM run enabled")
    return me, other


def _hidden(cube, agent, max_resident_bytes=None):
    """The reader's ToM-run states as :class:`synclib.cube.HiddenRows`."""
    from synclib.cube import HiddenRows

    me = "a" if agent == "A" else "b"
    return HiddenRows(cube[f"hidden_{me}_tom"], max_resident_bytes)


def _tom_samples(cube, agent, relation, target, hidden):
    """Row numbers into ``hidden`` (flat (episode, sim_seed, round)), target
    distributions and episode positions of one probe's samples."""
    me, other = _check_vars(cube, agent, relation, target)
    E, S, R = hidden.grid
    if relation == "self_current":
        tgt_var, shift = f"{target}_{me}", 0
    elif relation == "partner_previous":
        shift = -1 if agent == "A" else 0
        tgt_var = f"{target}_{other}"
    else:
        shift = 0 if agent == "A" else 1
        tgt_var = f"{target}_{other}"
    P = np.asarray(cube[tgt_var].values, dtype=np.float64)
    e, s, k = (g.ravel() for g in np.meshgrid(np.arange(E), np.arange(S), np.arange(R), indexing="ij"))
    kt = k + shift
    inside = (kt >= 0) & (kt < R)
    e, s, k, kt = e[inside], s[inside], k[inside], kt[inside]
    rows = (e * S + s) * R + k
    Pt = P[e, s, kt]
    keep = hidden.ok[rows] & np.isfinite(Pt).all(1)
    return rows[keep], Pt[keep], e[keep]


def tom_dataset(cube, agent: str, relation: str, target: str):
    """Samples for one probe.

    Returns
    -------
    X : (n, L, D) hidden states of the reader (as stored)
    P : (n, K) target distributions
    episode : (n,) episode position of each sample
    """
    _check_vars(cube, agent, relation, target)
    hidden = _hidden(cube, agent)
    rows, P, ep = _tom_samples(cube, agent, relation, target, hidden)
    return hidden[rows], P, ep


def _ridge_fit_predict(Xtr, Ttr, Xte_list, alpha):
    """Ridge (intercept unpenalised) in float64; returns predictions for each test block."""
    mx = Xtr.mean(0, keepdim=True)
    mt = Ttr.mean(0, keepdim=True)
    Xc = Xtr - mx
    n, d = Xc.shape
    if d <= n:
        A = Xc.T @ Xc
        A.diagonal().add_(alpha)
        W = torch.cholesky_solve(Xc.T @ (Ttr - mt), torch.linalg.cholesky(A))
    else:
        K = Xc @ Xc.T
        K.diagonal().add_(alpha)
        W = Xc.T @ torch.cholesky_solve(Ttr - mt, torch.linalg.cholesky(K))
    return [(Xt - mx) @ W + mt for Xt in Xte_list]


def _probe_kl(logits, P):
    q = torch.softmax(logits, -1).cpu().numpy()
    return float(kl_divergence(P, q).mean())


def tom_decode(cube, split_seeds=(0, 1, 2), *, alphas=DEFAULT_TOM_ALPHAS, val_frac: float = 0.2,
               test_frac: float = 0.2, device=None, max_resident_bytes: int | None = None,
               progress: bool = False):
    """ToM decoding for both readers, three relations, emotions and actions.

    Parameters
    ----------
    cube : cube with the ToM variables (``hidden_*_tom``, ``emotion_*``, ``action_*``).
    split_seeds : episode-grouped 80/20 splits.
    alphas : ridge penalties searched (with the layer) on the validation part.
    val_frac : fraction of training samples (whole episodes) used for validation.
    max_resident_bytes : a reader's states up to this size are loaded whole;
        larger ones (lazily opened cubes) are read in blocks of layers of about
        this size (see :class:`synclib.cube.HiddenRows`).

    Returns
    -------
    xarray.Dataset with ``tom_kl`` (tom_target, tom_relation, agent, split_seed,
    tom_layer), ``tom_kl_best``, ``tom_kl_baseline``, ``tom_best_layer``,
    ``tom_best_alpha`` (tom_target, tom_relation, agent, split_seed), summary
    ``tom_kl_best_mean``/``_se`` and ``tom_kl_baseline_mean``/``_se``
    (tom_target, tom_relation, agent), ``tom_n_train``, ``tom_n_test``.
    """
    import xarray as xr
    from tqdm.auto import tqdm

    from synclib.analysis import episode_split, mean_se

    dev = torch.device(device or "cpu")
    seeds = [int(s) for s in split_seeds]
    L = max(cube.sizes["layer_a"], cube.sizes["layer_b"])
    shape = (len(TOM_TARGETS), len(TOM_RELATIONS), len(AGENTS), len(seeds))
    kl = np.full(shape + (L,), np.nan)
    best = np.full(shape, np.nan)
    base = np.full(shape, np.nan)
    best_layer = np.full(shape, -1, dtype=np.int64)
    best_alpha = np.full(shape, np.nan)
    ntr = np.zeros(shape[1:], dtype=np.int64)
    nte = np.zeros(shape[1:], dtype=np.int64)
    val_kl = np.full(shape + (L, len(alphas)), np.inf)
    n_layers = {"A": cube.sizes["layer_a"], "B": cube.sizes["layer_b"]}
    bar = tqdm(total=int(np.prod(shape[:2])) * len(seeds) * sum(n_layers.values()), desc="ToM probes",
               disable=not progress, file=sys.stderr)
    for ai, agent in enumerate(AGENTS):
        for target in TOM_TARGETS:  # before reading anything
            _check_vars(cube, agent, TOM_RELATIONS[0], target)
        hidden = _hidden(cube, agent, max_resident_bytes)
        La = hidden.shape[1]
        # every probe of this reader: its samples, targets and splits
        probes = []
        for ti, target in enumerate(TOM_TARGETS):
            for ri, rel in enumerate(TOM_RELATIONS):
                rows, P, ep = _tom_samples(cube, agent, rel, target, hidden)
                T = np.log(np.clip(P, _EPS, None))
                T -= T.mean(1, keepdims=True)
                for si, seed in enumerate(seeds):
                    tr, te, _ = episode_split(ep, None, seed, test_frac=test_frac)
                    fit, val, _ = episode_split(ep[tr], None, seed + 10_000, test_frac=val_frac)
                    fit, val = tr[fit], tr[val]
                    if min(len(fit), len(val), len(te)) < 2:
                        bar.update(La)
                        continue
                    ntr[ri, ai, si], nte[ri, ai, si] = len(tr), len(te)
                    base[ti, ri, ai, si] = kl_divergence(P[te], P[tr].mean(0)[None]).mean()
                    probes.append(((ti, ri, ai, si), rows, P, T, fit, val, tr, te))
        if not probes:
            continue
        # read the states in blocks of layers (all layers when they fit the budget)
        used = np.unique(np.concatenate([p[1] for p in probes]))
        row_bytes = hidden.shape[2] * hidden.dtype.itemsize * len(used)
        block = La if hidden.resident else max(1, hidden.max_resident_bytes // max(row_bytes, 1))
        for l0 in range(0, La, block):
            Xb = hidden[used, slice(l0, min(La, l0 + block))]
            for key, rows, P, T, fit, val, tr, te in probes:
                pos = np.searchsorted(used, rows)
                Tt = lambda idx: torch.as_tensor(T[idx], device=dev)  # noqa: E731
                for j0 in range(Xb.shape[1]):
                    l = l0 + j0
                    Xl = torch.as_tensor(Xb[pos, j0], dtype=torch.float64, device=dev)
                    for j, a in enumerate(alphas):
                        (pv,) = _ridge_fit_predict(Xl[fit], Tt(fit), [Xl[val]], a)
                        val_kl[key + (l, j)] = _probe_kl(pv, P[val])
                    j = int(np.argmin(val_kl[key + (l,)]))
                    (pt,) = _ridge_fit_predict(Xl[tr], Tt(tr), [Xl[te]], alphas[j])
                    kl[key + (l,)] = _probe_kl(pt, P[te])
                    bar.update(1)
            del Xb
        for key, *_ in probes:
            l, j = np.unravel_index(int(np.argmin(val_kl[key])), val_kl[key].shape)
            best_layer[key] = l
            best_alpha[key] = alphas[j]
            best[key] = kl[key + (l,)]
    bar.close()
    dims = ("tom_target", "tom_relation", "agent", "split_seed")
    ds = xr.Dataset(
        {
            "tom_kl": (dims + ("tom_layer",), kl),
            "tom_kl_best": (dims, best),
            "tom_kl_baseline": (dims, base),
            "tom_best_layer": (dims, best_layer),
            "tom_best_alpha": (dims, best_alpha),
            "tom_n_train": (dims[1:], ntr),
            "tom_n_test": (dims[1:], nte),
        },
        coords={"tom_target": list(TOM_TARGETS), "tom_relation": list(TOM_RELATIONS),
                "agent": list(AGENTS), "split_seed": seeds, "tom_layer": np.arange(L)},
    )
    for name in ("tom_kl_best", "tom_kl_baseline"):
        m, se = mean_se(ds[name].values)
        ds[f"{name}_mean"] = (dims[:-1], m)
        ds[f"{name}_se"] = (dims[:-1], se)
    return ds
