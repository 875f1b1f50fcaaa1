"""Surrogate partners (ours): genuine SyncR² against a distribution of dialogs that never met.

Hyperscanning practice tests the synchrony of a real pair against many *surrogate* pairings:
the same source states, each paired with the states of a partner who took part in another
interaction.  Here each dialog gets ``n`` partner dialogs it did not take part in
(:func:`surrogate_partners`); surrogate ``m`` pairs every genuine sample's source state with
the target state its dialog's ``m``-th partner holds at the same round.  A surrogate keeps
the genuine split, source rows and penalties and changes only the targets, so one
factorisation of the source side serves every surrogate (:func:`synclib.analysis.ridge.r2_grid_targets`):
the analysis grows by the scoring products only, not by a fit per surrogate.

The same batch scores the genuine targets on the same rows (``sync_r2_surrogate_genuine``),
so that genuine and surrogates differ in nothing but who the partner was; where every partner
has a state at every round the dialog needs (the usual case) it equals the genuine
``sync_r2``.  The bootstrap of whole episodes (:data:`synclib.analysis.blocks.BOOT_RULE`,
the same draws) gives the gap, genuine minus the surrogates' mean, on each resample.
"""
from __future__ import annotations

import warnings

import numpy as np
import xarray as xr

from synclib.analysis.context import Context, GenuineFits
from synclib.analysis.ridge import ComputeOptions, r2_grid_targets, resampled_r2
from synclib.analysis.samples import PairedSamples, persona_keys, sim_seed_rank
from synclib.analysis.scores import sync_r2_many
from synclib.splits import RidgeInputError

__all__ = ["SURROGATE_RULE", "surrogate_partners", "surrogate_rows", "surrogate_block"]

SURROGATE_RULE = (
    "ours (after hyperscanning's surrogate pairs; the paper has none): surrogate m pairs every genuine sample's "
    "source state with the target state that the m-th partner dialog of its dialog holds at the same round. A "
    "dialog's partners, in order: the same task under each other simulation seed (same personas and scenario), "
    "then the other tasks of its scenario (other personas), then the tasks of other scenarios, each list in "
    "cube order after the dialog (cyclic); partners holding a state at every round the dialog needs come first; "
    "with fewer dialogs than surrogates the list repeats. Each surrogate keeps the genuine split (equal samples), "
    "source rows and penalty per source layer; rows whose partner lacks the round are left out of every "
    "surrogate and of sync_r2_surrogate_genuine, the genuine targets scored on the same rows in the same batch. "
    "Scores aggregate over split seeds as sync_r2; surrogate_gap_boot is sync_r2_surrogate_genuine minus the "
    "surrogates' mean on each resample of whole episodes (boot_rule).")


def _episode_keys(cube) -> tuple[np.ndarray, np.ndarray]:
    """The scenario and the persona key of each episode, ``(E,)`` str each."""
    E = cube.sizes["episode"]
    env = np.asarray(cube["env_id"].values).astype(str) if "env_id" in cube.coords else np.zeros(E, dtype=str)
    personas = persona_keys(cube) if "agent1_id" in cube.coords else np.arange(E).astype(str)
    return env, personas


def _dialog_order(env: np.ndarray) -> list[list[int]]:
    """Per episode, the other episodes: those of its scenario (``env``), then the rest, each in
    cube order after it (cyclic)."""
    E = len(env)
    order = []
    for e in range(E):
        after = [(e + j) % E for j in range(1, E)]
        order.append([o for o in after if env[o] == env[e]] + [o for o in after if env[o] != env[e]])
    return order


def surrogate_partners(cube, samples: PairedSamples, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The partner dialogs of every dialog (:data:`SURROGATE_RULE`).

    Parameters
    ----------
    cube : xarray.Dataset
        In the cube schema.
    samples : PairedSamples
        The genuine samples of one direction (their rounds say which target rounds a partner needs).
    n : int
        Surrogates per dialog.

    Returns
    -------
    episode, sim_seed : int arrays (E, S, n)
        Positions of the ``m``-th partner of (episode position, seed position).  Empty along the
        last axis (n = 0) for a cube of one dialog.
    """
    E, S, R = (cube.sizes[d] for d in ("episode", "sim_seed", "round"))
    pe, ps = np.zeros((E, S, n), dtype=np.int64), np.zeros((E, S, n), dtype=np.int64)
    if E * S < 2:
        return pe[..., :0], ps[..., :0]
    ok = samples.Y.ok.reshape(E, S, -1)[..., :R]
    shift = int(samples.info.get("round_shift", 0))
    need = np.zeros((E, S, R), dtype=bool)
    need[samples.episode, samples.sim_seed, samples.round + shift] = True
    by_rank = np.argsort(sim_seed_rank(cube))   # seed positions in ascending seed order
    rank_of = np.argsort(by_rank)
    order = _dialog_order(_episode_keys(cube)[0])
    for e in range(E):
        for s in range(S):
            r = rank_of[s]
            cands = [(e, by_rank[(r + j) % S]) for j in range(1, S)] + [(o, s) for o in order[e]]
            covers = [c for c in cands if not (need[e, s] & ~ok[c]).any()]
            ranked = covers + [c for c in cands if c not in covers]
            chosen = [ranked[m % len(ranked)] for m in range(n)]
            pe[e, s], ps[e, s] = np.array(chosen).T
    return pe, ps


def surrogate_rows(cube, samples: PairedSamples, n: int) -> tuple[np.ndarray, dict]:
    """Each genuine sample's target row under each surrogate: rows of ``samples.Y`` (n_samples, n),
    -1 where the partner has no state at that round; and per surrogate the share of samples whose
    partner dialog has the same persona pair (``same_personas``) and scenario (``same_scenario``),
    each (n,)."""
    E, S, R = (cube.sizes[d] for d in ("episode", "sim_seed", "round"))
    pe, ps = surrogate_partners(cube, samples, n)
    e, s = samples.episode, samples.sim_seed
    k = samples.round + int(samples.info.get("round_shift", 0))
    rows = (pe[e, s] * S + ps[e, s]) * R + k[:, None]                       # (n_samples, n)
    rows = np.where(samples.Y.ok[rows], rows, -1) if rows.size else rows
    env, personas = _episode_keys(cube)
    share = {"same_personas": (personas[pe[e, s]] == personas[e][:, None]).mean(0) if rows.size else np.zeros(0),
             "same_scenario": (env[pe[e, s]] == env[e][:, None]).mean(0) if rows.size else np.zeros(0)}
    return rows, share


def _inputs(samples: PairedSamples, tr, te, y_sets):
    """``X, Y, x_train, x_test, targets`` for :func:`synclib.analysis.ridge.r2_grid_targets`: the whole
    arrays when both are in memory, otherwise only the rows needed, read from disk."""
    xtr, xte = samples.x_rows[tr], samples.x_rows[te]
    if samples.X.resident and samples.Y.resident:
        return samples.X.array, samples.Y.array, xtr, xte, y_sets
    xu, xinv = np.unique(np.concatenate([xtr, xte]), return_inverse=True)
    yu, yinv = np.unique(np.concatenate([np.concatenate(p) for p in y_sets]), return_inverse=True)
    sizes = [len(a) for p in y_sets for a in p]
    parts = np.split(yinv, np.cumsum(sizes)[:-1])
    return (samples.X[xu], samples.Y[yu], xinv[:len(xtr)], xinv[len(xtr):],
            [(parts[2 * i], parts[2 * i + 1]) for i in range(len(y_sets))])


def _seed_fit(ctx: Context, samples: PairedSamples, fit, rows: np.ndarray):
    """One split seed: the grids (T, L_src, L_tgt) of the genuine targets (set 0) and of every
    surrogate on the rows every partner covers, and their group losses per test episode."""
    keep = (rows >= 0).all(1)
    tr, te = fit.train[keep[fit.train]], fit.test[keep[fit.test]]
    y_sets = [(samples.y_rows[tr], samples.y_rows[te])] + [(rows[tr, m], rows[te, m]) for m in range(rows.shape[1])]
    X, Y, xtr, xte, targets = _inputs(samples, tr, te, y_sets)
    out = r2_grid_targets(X, Y, xtr, xte, targets, fit.alpha, test_groups=samples.episode[te],
                          compute=ComputeOptions(precision=ctx.precision, device=ctx.device))
    g = out.test_loss
    return out.r2, (g.labels, g.loss, g.sizes), len(tr), len(te)


def _gap_resamples(grids: list, losses: list, counts: np.ndarray) -> np.ndarray:
    """Genuine minus the surrogates' mean SyncR² on each resample of whole episodes (B,): per
    target set, each split seed's grid on the drawn test episodes (maps fixed), averaged over
    the seeds, then SyncR²; one set at a time (a set's resamples are B grids)."""
    per_set = []
    for t in range(len(grids[0])):
        drawn = [resampled_r2(g[t], loss[t], sizes, counts[:, eps]) for g, (eps, loss, sizes) in zip(grids, losses)]
        with warnings.catch_warnings():  # a seed without a drawn test episode: NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            per_set.append(sync_r2_many(np.nanmean(drawn, axis=0)))
        del drawn
    return per_set[0] - np.mean(per_set[1:], axis=0)


def surrogate_block(ctx: Context, genuine: GenuineFits, n: int, counts=None) -> xr.Dataset:
    """Genuine SyncR² against ``n`` surrogate partners per dialog (:data:`SURROGATE_RULE`).

    Parameters
    ----------
    ctx : Context
    genuine : GenuineFits
        The genuine samples and fits of the conditions block (their splits and penalties).
    n : int
        Surrogates per dialog (at least 1).
    counts : array (B, E), optional
        :func:`synclib.analysis.blocks.episode_draws`, the draws of ``sync_r2_boot``.

    Returns
    -------
    xarray.Dataset
        ``sync_r2_surrogate`` (direction, surrogate), ``sync_r2_surrogate_genuine`` (direction),
        ``surrogate_same_personas`` and ``surrogate_same_scenario`` (direction, surrogate: share
        of samples whose partner dialog shares the persona pair / the scenario),
        ``n_train_surrogate``, ``n_test_surrogate`` (direction, split_seed); with ``counts``,
        ``surrogate_gap_boot`` (direction, boot); attribute ``surrogate_rule``.
    """
    D, S = len(ctx.directions), len(ctx.split_seeds)
    value, gen = np.full((D, n), np.nan), np.full(D, np.nan)
    same_p, same_s = np.full((D, n), np.nan), np.full((D, n), np.nan)
    n_tr, n_te = np.zeros((D, S), dtype=np.int64), np.zeros((D, S), dtype=np.int64)
    B = 0 if counts is None else len(counts)
    gap = np.full((D, B), np.nan)
    for di, d in enumerate(ctx.directions):
        samples = genuine.samples.get(d)
        if samples is None or samples.n == 0:
            continue
        rows, share = surrogate_rows(ctx.cube, samples, n)
        if rows.shape[1] < n:
            ctx.note(f"surrogates {d}: the run has a single dialog, so there are no surrogate partners")
            continue
        same_p[di], same_s[di] = share["same_personas"], share["same_scenario"]
        grids, losses = [], []
        for si, seed in enumerate(ctx.split_seeds):
            fit = genuine.fits.get((d, seed))
            if fit is None or not np.isfinite(fit.alpha).all():
                continue
            try:
                r2, loss, n_tr[di, si], n_te[di, si] = _seed_fit(ctx, samples, fit, rows)
            except RidgeInputError as exc:
                ctx.note(f"surrogates {d} split {seed}: not fitted ({exc}); left NaN")
                continue
            grids.append(r2)
            losses.append(loss)
        if not grids:
            continue
        scores = sync_r2_many(np.mean(grids, axis=0))                          # (1 + n,)
        gen[di], value[di] = scores[0], scores[1:]
        if counts is not None:
            gap[di] = _gap_resamples(grids, losses, counts)
    cds = {"direction": list(ctx.directions), "surrogate": np.arange(n), "split_seed": list(ctx.split_seeds)}
    out = xr.Dataset({"sync_r2_surrogate": (("direction", "surrogate"), value),
                      "sync_r2_surrogate_genuine": (("direction",), gen),
                      "surrogate_same_personas": (("direction", "surrogate"), same_p),
                      "surrogate_same_scenario": (("direction", "surrogate"), same_s),
                      "n_train_surrogate": (("direction", "split_seed"), n_tr),
                      "n_test_surrogate": (("direction", "split_seed"), n_te)}, coords=cds)
    if counts is not None:
        out["surrogate_gap_boot"] = (("direction", "boot"), gap)
    out.attrs["surrogate_rule"] = SURROGATE_RULE
    return out
