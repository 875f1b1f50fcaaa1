"""Surrogate partners (ours): genuine SyncR² against a distribution of dialogs that never met.

As hyperscanning tests a real pair's synchrony against *surrogate* pairings (the same source states, each paired with
a partner from another interaction), each dialog gets ``n`` partner dialogs it did not take part in
(:func:`surrogate_partners`); surrogate ``m`` pairs every genuine sample's source state with the target state its
dialog's ``m``-th partner holds at the same round.  A surrogate keeps the genuine split and source rows and changes
only the targets; with ``alpha="cv"`` it chooses its own penalties by genuine's CV (held to genuine's it would be
fitted worse than it can be, the null biased low), the folds' source sides factorised once for every surrogate
(:func:`synclib.analysis.ridge.cv_penalties`), each source layer once per distinct penalty
(:func:`synclib.analysis.ridge.r2_grid_targets`).

The same batch scores the genuine targets on the same rows (``sync_r2_surrogate_genuine``; the genuine ``sync_r2``
where every partner has every round the dialog needs), and the bootstrap of whole episodes
(:data:`synclib.analysis.blocks.BOOT_RULE`, the same draws) gives the gap, genuine minus the surrogates' mean.
"""
from __future__ import annotations

import numpy as np
import xarray as xr

from synclib.analysis.context import Context, GenuineFits
from synclib.analysis.ridge import ComputeOptions, cv_penalties, r2_grid_targets
from synclib.analysis.samples import PairedSamples, persona_keys, sim_seed_rank
from synclib.analysis.scores import sync_r2_many
from synclib.splits import RidgeInputError

__all__ = ["SURROGATE_RULE", "SURROGATE_SPLITS", "surrogate_partners", "surrogate_rows", "surrogate_block"]

SURROGATE_RULE = (
    "ours (after hyperscanning's surrogate pairs; the paper has none): surrogate m pairs every genuine sample's "
    "source state with the target state that the m-th partner dialog of its dialog holds at the same round. A "
    "dialog's candidate partners, in order: the same task under each other simulation seed (same personas and "
    "scenario), then the other tasks of its scenario (other personas), then the tasks of other scenarios, each "
    "list in cube order after the dialog (cyclic); its partners are the candidates holding a state at every "
    "round the dialog needs (all candidates where none does), first in that order, then, once they are used "
    "up, each further surrogate draws the dialog's partner from them at random "
    "(numpy.random.default_rng([PARTNER_SEED, episode, seed])), so that every surrogate is another pairing of "
    "the whole run even with fewer dialogs than surrogates. Each surrogate keeps the genuine split and source "
    "rows and chooses its own penalty per source layer by the analysis' own rule (alpha='cv': the same grouped "
    "CV on the same training rows, as the genuine fit chose its; a fixed alpha: that alpha), so that a "
    "surrogate is fitted as well as genuine is; rows whose partner lacks the round are left out of every "
    "surrogate and of sync_r2_surrogate_genuine, the genuine targets scored on the same rows in the same batch "
    "by the same rule. "
    "The surrogates and genuine on their rows are fitted on the first SURROGATE_SPLITS split seeds (the "
    "reference's three, 0, 1, 2, where the run has them) and aggregate over them as sync_r2; surrogate_gap_boot is sync_r2_surrogate_genuine minus the "
    "surrogates' mean on each resample of whole episodes (boot_rule).")


#: seed of the partners drawn once a dialog's candidates are used up (:data:`SURROGATE_RULE`)
PARTNER_SEED = 0
#: split seeds the surrogate test fits, the run's first (the reference's three): genuine and its surrogates share
#: them, so fewer only widen both alike; the controls' paired tests use every split seed
SURROGATE_SPLITS = 3


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
    """The partner dialogs of every dialog (:data:`SURROGATE_RULE`): ``(episode, sim_seed)``, int arrays (E, S, n),
    the positions of the ``m``-th of ``n`` partners of (episode position, seed position); empty along the last axis
    for a cube of one dialog.  ``samples``: the genuine samples of one direction (their rounds say which target
    rounds a partner needs)."""
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
            pool = covers or cands  # no partner holds every round this dialog needs: its rows drop
            rng = np.random.default_rng([PARTNER_SEED, e, s])
            extra = rng.integers(0, len(pool), size=max(0, n - len(pool)))
            chosen = pool[:n] + [pool[i] for i in extra]
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


def split_inputs(samples: PairedSamples, tr, te, y_sets, layers=None):
    """``X, Y, x_train, x_test, targets`` for :func:`synclib.analysis.ridge.r2_grid_targets`: the whole
    arrays when both are in memory, otherwise only the rows needed, read from disk.  ``layers``
    (a pair of int arrays): only these source and target layers (the rows read, then the layers taken)."""
    xtr, xte = samples.x_rows[tr], samples.x_rows[te]
    if samples.X.resident and samples.Y.resident and layers is None:
        return samples.X.array, samples.Y.array, xtr, xte, y_sets
    xu, xinv = np.unique(np.concatenate([xtr, xte]), return_inverse=True)
    yu, yinv = np.unique(np.concatenate([np.concatenate(p) for p in y_sets]), return_inverse=True)
    sizes = [len(a) for p in y_sets for a in p]
    parts = np.split(yinv, np.cumsum(sizes)[:-1])
    X, Y = samples.X[xu], samples.Y[yu]
    if layers is not None:
        X, Y = X[:, layers[0]], Y[:, layers[1]]
    return (X, Y, xinv[:len(xtr)], xinv[len(xtr):],
            [(parts[2 * i], parts[2 * i + 1]) for i in range(len(y_sets))])


def _seed_fit(ctx: Context, samples: PairedSamples, fit, rows: np.ndarray):
    """One split seed: the grids (T, L_src, L_tgt) of the genuine targets (set 0) and every surrogate on the rows
    every partner covers, their group losses per test episode, and the penalties (T, L_src): each set's own by the
    same CV (:func:`synclib.analysis.ridge.cv_penalties`) with a CV penalty, else the genuine fit's."""
    keep = (rows >= 0).all(1)
    tr, te = fit.train[keep[fit.train]], fit.test[keep[fit.test]]
    y_sets = [(samples.y_rows[tr], samples.y_rows[te])] + [(rows[tr, m], rows[te, m]) for m in range(rows.shape[1])]
    X, Y, xtr, xte, targets = split_inputs(samples, tr, te, y_sets)
    compute = ComputeOptions(precision=ctx.precision, device=ctx.device)
    if ctx.penalty.cv:
        alphas = cv_penalties(X, Y, xtr, [t[0] for t in targets], ctx.penalty, samples.episode[tr], compute=compute)
    else:
        alphas = np.broadcast_to(np.asarray(fit.alpha, dtype=np.float64), (len(targets), len(fit.alpha))).copy()
    out = r2_grid_targets(X, Y, xtr, xte, targets, alphas, test_groups=samples.episode[te], compute=compute)
    g = out.test_loss
    return out.r2, (g.labels, g.loss, g.sizes), len(tr), len(te), alphas


#: bytes one chunk of target sets' resampled grids may take (:func:`_gap_resamples`)
GAP_CHUNK_BYTES = 1 << 27


def _gap_resamples(grids: list, losses: list, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Genuine minus the surrogates' mean SyncR² on each resample of whole episodes, and genuine's own, (B,) each:
    per target set, each
    split seed's grid on the drawn test episodes (maps fixed, :func:`synclib.analysis.ridge.resampled_r2`), averaged
    over the seeds that drew a test episode, then SyncR²; the sets ``GAP_CHUNK_BYTES`` at a time, in float32."""
    T, B = len(grids[0]), len(counts)
    cell = int(np.prod(grids[0].shape[1:]))
    per = max(1, GAP_CHUNK_BYTES // (8 * B * cell))
    scores = np.empty((T, B))
    for t0 in range(0, T, per):
        t1 = min(T, t0 + per)
        # float32: the resamples only rank (their p resolves 1/B)
        total = np.zeros((B, t1 - t0) + grids[0].shape[1:], dtype=np.float32)
        seeds = np.zeros(B)
        for g, (eps, loss, sizes) in zip(grids, losses):   # one split seed: r2 (T, Ls, Lt), loss (T, G, Ls, Lt)
            c = counts[:, eps].astype(float)                # (B, G)
            sizes = np.asarray(sizes, float)
            n_b = c @ sizes
            ok = n_b > 0
            k = (g[t0:t1] + loss[t0:t1].sum(1)).astype(np.float32)                  # (t, Ls, Lt)
            drawn = np.tensordot(c.astype(np.float32), np.moveaxis(loss[t0:t1], 1, 0).astype(np.float32),
                                 axes=(1, 0))                                         # (B, t, Ls, Lt)
            drawn *= (-sizes.sum() / np.where(ok, n_b, 1.0) * ok).astype(np.float32)[:, None, None, None]
            drawn += k[None]
            drawn[~ok] = 0.0
            total += drawn
            seeds += ok
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = total / seeds[:, None, None, None]      # NaN where no seed drew a test episode
        scores[t0:t1] = sync_r2_many(mean).T
        del total, mean
    return scores[0] - scores[1:].mean(0), scores[0]


def surrogate_block(ctx: Context, genuine: GenuineFits, n: int, counts=None) -> xr.Dataset:
    """Genuine SyncR² against ``n`` (>= 1) surrogate partners per dialog (:data:`SURROGATE_RULE`), on ``genuine``'s
    samples, splits and penalties; ``counts`` (B, E): :func:`synclib.analysis.blocks.episode_draws`, the draws of
    ``sync_r2_boot``.

    Returns
    -------
    xarray.Dataset
        ``sync_r2_surrogate`` (direction, surrogate), ``sync_r2_surrogate_genuine`` (direction),
        ``surrogate_same_personas`` and ``surrogate_same_scenario`` (direction, surrogate: share of samples whose
        partner dialog shares the persona pair / the scenario), ``n_train_surrogate``, ``n_test_surrogate``
        (direction, split_seed), ``alpha_surrogate`` (direction, split_seed, target_set, src_layer: set 0 the genuine
        targets on the same rows, set ``m + 1`` surrogate ``m``; NaN past a model's layers); split seeds past the
        first :data:`SURROGATE_SPLITS` are left 0 and NaN; with ``counts``, ``surrogate_gap_boot`` (direction,
        boot) and ``surrogate_genuine_boot`` (direction, boot: genuine on the same rows and draws); attribute
        ``surrogate_rule``.
    """
    D, S = len(ctx.directions), len(ctx.split_seeds)
    value, gen = np.full((D, n), np.nan), np.full(D, np.nan)
    same_p, same_s = np.full((D, n), np.nan), np.full((D, n), np.nan)
    n_tr, n_te = np.zeros((D, S), dtype=np.int64), np.zeros((D, S), dtype=np.int64)
    B = 0 if counts is None else len(counts)
    gap, gen_boot = np.full((D, B), np.nan), np.full((D, B), np.nan)
    Ls = max(ctx.cube.sizes["layer_a"], ctx.cube.sizes["layer_b"])
    alpha = np.full((D, S, n + 1, Ls), np.nan)  # target set 0: the genuine targets on the same rows
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
        for si, seed in enumerate(ctx.split_seeds[:SURROGATE_SPLITS]):
            fit = genuine.fits.get((d, seed))
            if fit is None or not np.isfinite(fit.alpha).all():
                continue
            try:
                r2, loss, n_tr[di, si], n_te[di, si], alphas = _seed_fit(ctx, samples, fit, rows)
            except RidgeInputError as exc:
                ctx.note(f"surrogates {d} split {seed}: not fitted ({exc}); left NaN")
                continue
            grids.append(r2)
            losses.append(loss)
            alpha[di, si, :, :alphas.shape[1]] = alphas
        if not grids:
            continue
        scores = sync_r2_many(np.mean(grids, axis=0))                          # (1 + n,)
        gen[di], value[di] = scores[0], scores[1:]
        if counts is not None:
            gap[di], gen_boot[di] = _gap_resamples(grids, losses, counts)
    cds = {"direction": list(ctx.directions), "surrogate": np.arange(n), "split_seed": list(ctx.split_seeds)}
    out = xr.Dataset({"sync_r2_surrogate": (("direction", "surrogate"), value),
                      "sync_r2_surrogate_genuine": (("direction",), gen),
                      "surrogate_same_personas": (("direction", "surrogate"), same_p),
                      "surrogate_same_scenario": (("direction", "surrogate"), same_s),
                      "n_train_surrogate": (("direction", "split_seed"), n_tr),
                      "n_test_surrogate": (("direction", "split_seed"), n_te),
                      "alpha_surrogate": (("direction", "split_seed", "target_set", "src_layer"), alpha)},
                     coords={**cds, "target_set": np.arange(n + 1)})
    if counts is not None:
        out["surrogate_gap_boot"] = (("direction", "boot"), gap)
        out["surrogate_genuine_boot"] = (("direction", "boot"), gen_boot)
    out.attrs["surrogate_rule"] = SURROGATE_RULE
    return out
