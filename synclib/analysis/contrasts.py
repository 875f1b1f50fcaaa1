"""Every contrast on the same rows (ours): genuine against each control, fitted on the samples both hold, so that
only the targets differ.

A condition fitted on its own samples (the reference's design, ``sync_r2``) differs from genuine in more than its
targets: a lag has no sample at the dialog's last rounds, the passive reader reads only some seeds, a pseudo-dyad's
partner may end early; and which positions a dataset holds moves SyncR² by itself (the last utterances of a dialog
carry much of its synchrony).  A contrast takes the samples whose source position (episode, simulation seed, round)
both datasets hold (:func:`common_rows`), splits them by genuine's own split of each split seed and fits both sides
with the analysis' penalty rule (each its own CV): the sides have the same episodes, positions and counts and differ
in their targets (the passive reader: in whose state is read), and the bootstrap of whole episodes (the same draws)
pairs them.  A control holding exactly genuine's rows is not refitted (shuffled; passive with every seed read;
pseudo-dyads whose partners hold every round).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from synclib.analysis.context import Context
from synclib.analysis.samples import PairedSamples
from synclib.analysis.scores import seed_aggregate, sync_r2

__all__ = ["CONTRAST_RULE", "MATCHED_RULE", "SIDES", "common_rows", "contrast_fits", "contrast_variables"]

SIDES = ("genuine", "control")
#: seed of the size-matched genuine samples (:data:`MATCHED_RULE`)
MATCHED_SEED = 0

MATCHED_RULE = (
    "ours: a lag's contrast holds fewer samples than genuine (no lag at a dialog's last rounds) and at other "
    "positions. Beside genuine on the lag's rows, genuine is fitted on a random subset of all its own samples of the "
    "same size: as many training samples drawn from genuine's own training samples and test samples from its test "
    "samples as the contrast holds (numpy.random.default_rng([MATCHED_SEED, lag, split seed])), with the analysis' "
    "penalty rule. Genuine on all rows minus this is what the smaller n alone costs; this minus genuine on the lag's "
    "rows is what the lag's positions cost at the same n. Variables sync_r2_matched (contrast, direction, "
    "split_seed), sync_r2_matched_pooled, n_train_matched and with resamples sync_r2_matched_boot; NaN for "
    "controls other than the lags.")

CONTRAST_RULE = (
    "ours (the reference compares conditions each fitted on its own samples): for each control, genuine and the "
    "control fitted on the samples both hold (the same source positions: episode, simulation seed, round), split by "
    "genuine's own split of each split seed (its training and test episodes), each side with the analysis' penalty "
    "rule (its own CV), so that n_train and n_test are equal and the sides differ only in their targets (the "
    "passive reader: in whose state is read at the same position). Where a control holds exactly genuine's rows its "
    "own fits are the contrast's. sync_r2_contrast: per split seed; sync_r2_contrast_pooled: aggregated over split "
    "seeds as sync_r2; sync_r2_contrast_boot: the same on each resample of whole episodes (boot_rule, the same draws "
    "for both sides). Genuine's sync_r2 on all its samples stays the headline value.")


def common_rows(genuine: PairedSamples, control: PairedSamples) -> tuple[np.ndarray, np.ndarray]:
    """The samples both datasets hold at the same source position: indices into ``genuine`` and
    into ``control``, aligned (the ``i``-th of each is the same position), in genuine's order."""
    R = int(max(genuine.round.max(initial=0), control.round.max(initial=0))) + 1
    S = int(max(genuine.sim_seed.max(initial=0), control.sim_seed.max(initial=0))) + 1

    def key(s):
        return (s.episode.astype(np.int64) * S + s.sim_seed) * R + s.round

    kg, kc = key(genuine), key(control)
    pos = {int(k): i for i, k in enumerate(kc)}
    gi = np.array([i for i, k in enumerate(kg) if int(k) in pos], dtype=np.int64)
    ci = np.array([pos[int(kg[i])] for i in gi], dtype=np.int64)
    return gi, ci


def _restrict(s: PairedSamples, idx: np.ndarray) -> PairedSamples:
    return replace(s, x_rows=s.x_rows[idx], y_rows=s.y_rows[idx], episode=s.episode[idx],
                   sim_seed=s.sim_seed[idx], round=s.round[idx])


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return len(a) == len(b) and bool(np.array_equal(np.sort(a), np.sort(b)))


def contrast_fits(ctx: Context, genuine: PairedSamples, control: PairedSamples, genuine_fits: list,
                  control_fits: list) -> tuple[list, list]:
    """Genuine and ``control`` (one direction's datasets) on the rows both hold, per split seed of ``ctx``
    (:data:`CONTRAST_RULE`), from their own fits ``genuine_fits``, ``control_fits`` (SplitFit or None per split
    seed, the conditions block's): genuine's splits are the contrast's, and a control holding exactly genuine's rows
    and split is not refitted.  Returns ``(genuine side, control side, matched)``: lists of SplitFit or None per split
    seed, the sides on the same training and test positions, with the test loss per episode and round (for the
    episode bootstrap); ``matched`` (a lag only, else None): genuine on a random subset of its own samples of the
    contrast's size (:data:`MATCHED_RULE`)."""
    gi, ci = common_rows(genuine, control)
    whole = len(gi) == genuine.n == control.n and np.array_equal(gi, np.arange(genuine.n)) \
        and np.array_equal(ci, np.arange(control.n))
    g_sub, c_sub = _restrict(genuine, gi), _restrict(control, ci)
    sides_g, sides_c = [], []
    lag = int(control.condition[3:]) if control.condition.startswith("lag") else 0
    matched = [] if lag else None
    for seed, gf, cf in zip(ctx.split_seeds, genuine_fits, control_fits):
        if gf is None:
            sides_g.append(None)
            sides_c.append(None)
            if lag:
                matched.append(None)
            ctx.bar.update(2 + bool(lag))
            continue
        if control.condition == "shuffled" or (whole and cf is not None and _same(gf.train, cf.train)
                                                and _same(gf.test, cf.test)):
            # the shuffled control is genuine's samples and split, its targets permuted in training
            sides_g.append(gf)
            sides_c.append(cf)
            ctx.bar.update(2)
            continue
        in_train = np.isin(gi, gf.train)
        in_test = np.isin(gi, gf.test)
        tr, te = np.flatnonzero(in_train), np.flatnonzero(in_test)
        label = f"{control.condition} {control.direction} contrast split {seed}"
        split = {**(gf.split or {}), "contrast": control.condition}
        for sub, out in ((g_sub, sides_g), (c_sub, sides_c)):
            out.append(ctx.fit(sub, seed, tr, te, f"{label} ({sub.condition} side)", split=split, episode_loss=True))
            ctx.bar.update(1)
        if lag:  # genuine at the contrast's size on its own positions
            rng = np.random.default_rng([MATCHED_SEED, lag, seed])
            m_tr = np.sort(rng.choice(gf.train, size=min(len(tr), len(gf.train)), replace=False))
            m_te = np.sort(rng.choice(gf.test, size=min(len(te), len(gf.test)), replace=False))
            matched.append(ctx.fit(genuine, seed, m_tr, m_te, f"{label} (genuine at its size)",
                                   split={**split, "matched": True}, episode_loss=True))
            ctx.bar.update(1)
    return sides_g, sides_c, matched


def _seed_mean(fits: list, n_layers: int) -> np.ndarray:
    """The fits' grids padded to ``n_layers`` (S, L, L); NaN where a seed was not fitted."""
    out = np.full((len(fits), n_layers, n_layers), np.nan)
    for si, f in enumerate(fits):
        if f is not None:
            Ls, Lt = f.r2.shape
            out[si, :Ls, :Lt] = f.r2
    return out


def contrast_variables(contrasts: dict, directions: tuple, n_seeds: int, n_layers: int,
                       boot=None) -> tuple[dict, list]:
    """The Dataset variables of every contrast, ``contrasts`` ``{(control, direction): (genuine side, control
    side, matched)}`` of :func:`contrast_fits`; ``boot(fits) -> (B,)``: SyncR² on resamples of whole episodes (the conditions
    block's :func:`synclib.analysis.blocks.episode_bootstrap` with its draws).

    Returns ``(variables, names)``: ``sync_r2_contrast``, ``n_train_contrast``, ``n_test_contrast`` (contrast,
    direction, split_seed, side), ``sync_r2_contrast_pooled`` (contrast, direction, side) and with ``boot``
    ``sync_r2_contrast_boot`` (contrast, direction, side, boot); the lags' size-matched genuine
    (:data:`MATCHED_RULE`): ``sync_r2_matched``, ``n_train_matched`` (contrast, direction, split_seed),
    ``sync_r2_matched_pooled`` (contrast, direction), with ``boot`` ``sync_r2_matched_boot``; the ``contrast``
    coordinate (the controls, in order).
    """
    names = list(dict.fromkeys(c for c, _ in contrasts))
    C, D = len(names), len(directions)
    per = np.full((C, D, n_seeds, 2), np.nan)
    pooled = np.full((C, D, 2), np.nan)
    n_tr = np.zeros((C, D, n_seeds, 2), dtype=np.int64)
    n_te = np.zeros((C, D, n_seeds, 2), dtype=np.int64)
    boots = None
    m_per, m_pooled = np.full((C, D, n_seeds), np.nan), np.full((C, D), np.nan)
    m_ntr, m_boot = np.zeros((C, D, n_seeds), dtype=np.int64), None
    for (c, d), (*sides, matched) in contrasts.items():
        ci, di = names.index(c), directions.index(d)
        for si, f in enumerate(matched or ()):
            if f is not None:
                m_per[ci, di, si], m_ntr[ci, di, si] = sync_r2(f.r2), len(f.train)
        if matched and np.isfinite(grids := _seed_mean(matched, n_layers)).any():
            m_pooled[ci, di] = seed_aggregate(grids).sync_r2
        if matched and boot is not None:
            b = boot(matched)
            m_boot = np.full((C, D, len(b)), np.nan) if m_boot is None else m_boot
            m_boot[ci, di] = b
        for k, fits in enumerate(sides):
            for si, f in enumerate(fits):
                if f is not None:
                    per[ci, di, si, k] = sync_r2(f.r2)
                    n_tr[ci, di, si, k], n_te[ci, di, si, k] = len(f.train), len(f.test)
            grids = _seed_mean(fits, n_layers)
            if np.isfinite(grids).any():
                pooled[ci, di, k] = seed_aggregate(grids).sync_r2
            if boot is not None:
                b = boot(fits)
                if boots is None:
                    boots = np.full((C, D, 2, len(b)), np.nan)
                boots[ci, di, k] = b
    dims = ("contrast", "direction", "split_seed", "side")
    out = {"sync_r2_contrast": (dims, per), "n_train_contrast": (dims, n_tr), "n_test_contrast": (dims, n_te),
           "sync_r2_contrast_pooled": (("contrast", "direction", "side"), pooled)}
    if boots is not None:
        out["sync_r2_contrast_boot"] = (("contrast", "direction", "side", "boot"), boots)
    if np.isfinite(m_per).any():
        out.update({"sync_r2_matched": (dims[:3], m_per), "n_train_matched": (dims[:3], m_ntr),
                    "sync_r2_matched_pooled": (dims[:2], m_pooled)})
        if m_boot is not None:
            out["sync_r2_matched_boot"] = (("contrast", "direction", "boot"), m_boot)
    return out, names
