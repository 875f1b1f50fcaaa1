"""Paired samples of one condition and direction: the index arithmetic of the protocol.

A sample pairs a source hidden state with a target hidden state (rounds ``k``):

===========  ========================================  ========================================
condition    A->B                                      B->A
===========  ========================================  ========================================
genuine      ``(hidden_a[k], hidden_b[k])``            ``(hidden_b[k], hidden_a[k+1])``
lag ``j``    ``(hidden_a[k], hidden_b[k+j])``          ``(hidden_b[k], hidden_a[k+1+j])``
passive      ``(hidden_a_passive[k], hidden_b[k])``    ``(hidden_b_passive[k], hidden_a[k+1])``
passive_own  as passive, from ``hidden_*_passive_own``  (the reader told it is the agent it replaces; ours)
shuffled     as genuine; training targets permuted     as genuine
             per split (:func:`shuffle_training_targets`)
pseudo       ``(hidden_a[k], hidden_b'[k])``           ``(hidden_b[k], hidden_a'[k+1])``
===========  ========================================  ========================================

``'`` marks the partner dialog of the pseudo-dyads (ours; :func:`pseudo_partners`), whose agents never talked to each
other but played the same task (or scenario) in the same format, at the same round.  Samples whose source or target
is not finite (unreached rounds) are dropped; they are ordered by episode, simulation seed (cube order), then round,
as the reference's datasets (``affine_transformation.py`` 209-278; protocol "Datasets for the affine maps").
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from synclib.cube import CubeError, HiddenRows, var_name

__all__ = ["AnalysisError", "DIRECTIONS", "CONDITIONS", "DEFAULT_CONDITIONS", "PairedSamples", "HiddenCache",
           "build_dataset", "parse_condition", "persona_keys", "pseudo_partners", "shuffle_training_targets",
           "sim_seed_rank"]

DIRECTIONS = ("A->B", "B->A")
#: the conditions without a lag; ``lagK`` (K >= 1) adds the lagged ones
CONDITIONS = ("genuine", "passive", "passive_own", "shuffled", "pseudo")
#: what :func:`synclib.analysis.analyze` fits unless told otherwise
DEFAULT_CONDITIONS = CONDITIONS + ("lag1", "lag2")


class AnalysisError(ValueError):
    """A cube or an option the analysis cannot work with."""


def parse_condition(condition: str) -> tuple[str, int]:
    """The kind and lag of a condition: ``'genuine'`` -> ``('genuine', 0)``, likewise
    ``'passive'``, ``'shuffled'`` and ``'pseudo'``; ``'lag2'`` -> ``('lag', 2)``."""
    if condition in CONDITIONS:
        return condition, 0
    if condition.startswith("lag") and condition[3:].isdigit() and int(condition[3:]) >= 1:
        return "lag", int(condition[3:])
    raise AnalysisError(f"unknown condition {condition!r}: use {', '.join(map(repr, CONDITIONS))} or "
                        "'lagK' (K >= 1)")


@dataclass
class PairedSamples:
    """Paired samples of one (condition, direction): sample ``i`` pairs row ``x_rows[i]`` of ``X`` with row
    ``y_rows[i]`` of ``Y``, the whole source / target variables as :class:`synclib.cube.HiddenRows` (rows (episode,
    sim_seed, round) flattened: (E*S*R, L_src, D_src), (E*S*R, L_tgt, D_tgt)); ``episode`` (position along the
    cube's episode dim), ``sim_seed`` and ``round`` (source round), each (n,), describe the samples."""
    condition: str
    direction: str
    X: HiddenRows
    Y: HiddenRows
    x_rows: np.ndarray
    y_rows: np.ndarray
    episode: np.ndarray
    sim_seed: np.ndarray
    round: np.ndarray
    info: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        """Number of samples."""
        return len(self.x_rows)

    def take(self, idx) -> tuple[np.ndarray, np.ndarray]:
        """Source and target arrays of samples ``idx``: (len(idx), L_src, D_src), (len(idx), L_tgt, D_tgt)."""
        return self.X[self.x_rows[idx]], self.Y[self.y_rows[idx]]

    def ridge_inputs(self, tr, te):
        """``(X, Y, train, test)`` for :func:`synclib.analysis.ridge.r2_grid` on samples ``tr``/``te``: the whole
        arrays with paired row indices when both are in memory, else only these samples' rows, read from disk."""
        if self.X.resident and self.Y.resident:
            return (self.X.array, self.Y.array,
                    (self.x_rows[tr], self.y_rows[tr]), (self.x_rows[te], self.y_rows[te]))
        Xs, Ys = self.take(np.concatenate([tr, te]))
        return Xs, Ys, np.arange(len(tr)), np.arange(len(tr), len(tr) + len(te))


class HiddenCache:
    """The cube's hidden-state variables as :class:`synclib.cube.HiddenRows`, opened
    once each: small ones loaded whole, larger ones (lazily opened cubes) streamed."""

    def __init__(self, cube, max_resident_bytes: int | None = None):
        self.cube = cube
        self.max_resident_bytes = max_resident_bytes
        self._cache: dict = {}

    def get(self, name: str) -> HiddenRows:
        """The variable ``name``, opened on first use."""
        if name not in self._cache:
            if name not in self.cube.variables:
                raise AnalysisError(f"the cube has no variable {name!r} (needed for this condition)")
            try:
                self._cache[name] = HiddenRows(self.cube[name], self.max_resident_bytes)
            except CubeError as exc:
                raise AnalysisError(str(exc)) from None
        return self._cache[name]

    def drop(self, name: str) -> None:
        """Forget ``name`` (frees its memory once nothing else holds it)."""
        self._cache.pop(name, None)


def pseudo_partners(cube) -> tuple[np.ndarray, np.ndarray, str]:
    """The partner dialog of every dialog for the pseudo-dyads (ours; no reference code).

    With two or more simulation seeds: the same task under the next seed (ascending, the last taking the first), so
    a pseudo-dyad differs from a genuine one only in that its agents did not talk to each other.  With one: the next
    task of the same scenario (``env_id``; without it, one scenario) in cube order, the last taking the first; tasks
    alone in their scenario are paired among themselves the same way, a single one left taking the next task in cube
    order (the one dialog that is a partner twice).  No dialog is its own partner.

    Returns ``(episode, sim_seed, rule)``: int arrays (E, S), the positions of the partner of (episode position,
    seed position), and the rule that applied, in words (for the page).  Raises :class:`AnalysisError` for a cube of
    one dialog.
    """
    E, S = cube.sizes["episode"], cube.sizes["sim_seed"]
    if E * S < 2:
        raise AnalysisError("pseudo-dyads need two dialogs: the cube has one episode and one simulation seed")
    ep = np.repeat(np.arange(E)[:, None], S, axis=1)
    if S >= 2:
        order = np.argsort(sim_seed_rank(cube))  # positions in ascending seed order
        nxt = np.empty(S, dtype=np.int64)
        nxt[order] = np.roll(order, -1)
        return ep, np.broadcast_to(nxt, (E, S)).copy(), "the same task under another simulation seed"
    env = np.asarray(cube["env_id"].values).astype(str) if "env_id" in cube.coords else np.zeros(E, dtype=str)
    groups = [np.flatnonzero(env == v) for v in dict.fromkeys(env)]
    alone = np.concatenate([g for g in groups if len(g) == 1] or [np.zeros(0, dtype=np.int64)])
    partner = np.arange(E)
    for g in [g for g in groups if len(g) > 1] + ([np.sort(alone)] if len(alone) > 1 else []):
        partner[g] = np.roll(g, -1)
    if len(alone) == 1:
        partner[alone[0]] = (alone[0] + 1) % E
    same = int((env[partner] == env).sum())
    which = "every task" if same == E else (f"{same} of {E} tasks; the rest, alone in their scenario, "
                                            "another scenario's task")
    return (partner[:, None], np.zeros((E, 1), dtype=np.int64),
            f"another task of the same scenario ({which}), one simulation seed")


def build_dataset(cube, direction: str, condition: str = "genuine",
                  arrays: HiddenCache | None = None) -> PairedSamples:
    """Paired samples of one direction and condition of ``cube`` (in memory or dask-backed; index arithmetic in
    the module doc).

    ``condition``: ``"genuine"``, ``"passive"``, ``"shuffled"`` (the genuine samples; targets shuffled per split by
    :func:`shuffle_training_targets`), ``"pseudo"`` (targets from the partner dialog of :func:`pseudo_partners`,
    ``info["partner"]`` the rule, ``info["same_task"]`` the share of samples whose partner is the same task; a cube
    of one dialog gives no sample) or ``"lagJ"`` (J >= 1).  ``arrays``: a
    shared :class:`HiddenCache` (re-uses variables already opened).
    """
    if direction not in DIRECTIONS:
        raise AnalysisError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    kind, lag = parse_condition(condition)
    arrays = arrays or HiddenCache(cube)
    src_side, tgt_side = ("a", "b") if direction == "A->B" else ("b", "a")
    src = var_name("hidden", src_side, kind if kind.startswith("passive") else "active")
    tgt = var_name("hidden", tgt_side)
    shift = lag + (0 if direction == "A->B" else 1)  # target round = source round + shift
    X, Y = arrays.get(src), arrays.get(tgt)
    E, S, R = (cube.sizes[d] for d in ("episode", "sim_seed", "round"))
    e, s, k = np.meshgrid(np.arange(E), np.arange(S), np.arange(R - shift), indexing="ij")
    e, s, k = e.ravel(), s.ravel(), k.ravel()
    x_rows = (e * S + s) * R + k
    y_rows = x_rows + shift
    info = {"source_var": src, "target_var": tgt, "round_shift": shift}
    keep = X.ok[x_rows]
    if kind == "pseudo" and E * S < 2:  # one dialog: no partner, so no sample (the fits say so)
        keep, info["partner"] = np.zeros_like(keep), "missing: the run has a single dialog, so there are no pseudo-dyads"
    elif kind == "pseudo":
        pe, ps, info["partner"] = pseudo_partners(cube)
        y_rows = (pe[e, s] * S + ps[e, s]) * R + k + shift
    keep = keep & Y.ok[y_rows]
    if kind == "pseudo" and keep.any():  # the share of samples whose partner plays the same task
        info["same_task"] = float((pe[e, s] == e)[keep].mean())
    info["n_dropped"] = int((~keep).sum())
    return PairedSamples(condition, direction, X, Y, x_rows[keep], y_rows[keep], e[keep], s[keep], k[keep], info)


def persona_keys(cube) -> np.ndarray:
    """Unordered agent-pair key per episode, e.g. ``"agent01|agent07"``; shape (E,)."""
    a1 = np.asarray(cube["agent1_id"].values).astype(str)
    a2 = np.asarray(cube["agent2_id"].values).astype(str)
    return np.array(["|".join(sorted(p)) for p in zip(a1, a2)])


def sim_seed_rank(cube) -> np.ndarray:
    """Rank of each position along the cube's ``sim_seed`` dim by its seed value, shape (S,):
    the order in which the reference reads a dialog's seeds (``seed_list`` 0 .. 4)."""
    S = cube.sizes["sim_seed"]
    if "sim_seed" not in cube.coords:
        return np.arange(S)
    return np.argsort(np.argsort(np.asarray(cube["sim_seed"].values), kind="stable"), kind="stable")


def shuffle_training_targets(samples: PairedSamples, train_groups, rs: np.random.RandomState,
                             seed_rank=None) -> np.ndarray:
    """The shuffled control's targets: ``y_rows`` (n,) with the training targets permuted within each dialog.

    The reference (``affine_transformation.py`` 356-372, ``shuffle=True``; protocol correction 13): after the split
    the *same* ``RandomState`` ``rs`` goes on (advanced in place); for each training episode in the order the split
    took it (``train_groups``: ``info["train_groups"]`` of :func:`synclib.splits.episode_split`; episodes without
    samples draw nothing), for each simulation seed in ascending order (``seed_rank``: :func:`sim_seed_rank`,
    default cube order), a dialog with ``m > 1`` samples gets ``perm = rs.permutation(m)`` and its targets (in
    round order) become ``targets[perm]``.  Test samples and sources are untouched.  ``samples``: the genuine
    samples of one direction.
    """
    seed_rank = np.arange(int(samples.sim_seed.max(initial=0)) + 1) if seed_rank is None else np.asarray(seed_rank)
    rank = seed_rank[samples.sim_seed]
    order = np.lexsort((samples.round, rank, samples.episode))  # episode, seed rank, round
    ep_sorted = samples.episode[order]
    y = samples.y_rows.copy()
    for g in train_groups:
        lo, hi = np.searchsorted(ep_sorted, g, "left"), np.searchsorted(ep_sorted, g, "right")
        idx = order[lo:hi]
        for r in np.unique(rank[idx]):  # ascending seed order
            seg = idx[rank[idx] == r]   # this dialog's samples, in round order
            if len(seg) > 1:
                y[seg] = samples.y_rows[seg[rs.permutation(len(seg))]]
    return y
