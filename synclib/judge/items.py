"""What the judge reads: one dialog (:class:`JudgeItem`), and the dialogs of a cube."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import numpy as np
import xarray as xr

from synclib.judge.errors import JudgeError
from synclib.keys import JUDGE_LAYOUTS
from synclib.tasks.prompts import complete_intro, judge_intro

__all__ = ["JudgeItem", "items_from_cube", "sample_items", "LAYOUTS"]

#: how the judge's message is laid out (:data:`synclib.keys.JUDGE_LAYOUTS`, the key's choices)
LAYOUTS = JUDGE_LAYOUTS


@dataclasses.dataclass(frozen=True)
class JudgeItem:
    """One dialog to judge.

    Attributes
    ----------
    episode, task_index, sim_seed : int
        Identity of the dialog in the cube.
    intro : str
        The complete, unmasked intro (scenario, both backgrounds, both goals).
    agent_names : tuple of 2 str
    utterances : tuple of str
        Utterance ``t`` is agent ``t % 2 + 1``'s.
    layout : {"sotopia", "reference"}
    transcript : str, optional
        The dialog as already rendered (a Sotopia export's ``social_interactions``), shown instead of ``utterances``.
    episode_id : str
        The episode's id in its file (:mod:`synclib.judge.episodes`); empty for cube dialogs.
    """

    episode: int
    task_index: int
    sim_seed: int
    intro: str
    agent_names: tuple[str, str]
    utterances: tuple[str, ...]
    layout: str = "sotopia"
    transcript: str | None = None
    episode_id: str = ""

    @property
    def empty(self) -> bool:
        """True when there are neither utterances nor a transcript."""
        return not (self.utterances or (self.transcript or "").strip())


def items_from_cube(cube: str | os.PathLike | xr.Dataset, tasks: Any,
                    intro: Callable[[Any], str] | None = None, layout: str = "sotopia") -> list[JudgeItem]:
    """The dialogs of a cube as :class:`JudgeItem` objects.

    Parameters
    ----------
    cube : path or xarray.Dataset
        Needs ``text_a``, ``text_b`` (episode, sim_seed, round), ``n_utterances`` (episode, sim_seed) and the
        ``task_index`` coordinate; utterance ``2k`` is ``text_a[..., k]``, ``2k+1`` is ``text_b[..., k]``.
    tasks : TaskSet
        The cube's task set.
    intro : callable, optional
        ``task -> str``; default :func:`~synclib.tasks.prompts.judge_intro` (``sotopia`` layout) or
        :func:`~synclib.tasks.prompts.complete_intro` (``reference``).
    layout : {"sotopia", "reference"}

    Returns
    -------
    list of JudgeItem, ordered by episode then sim seed.
    """
    if layout not in LAYOUTS:
        raise JudgeError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if intro is None:
        intro = complete_intro if layout == "reference" else judge_intro
    ds = cube if isinstance(cube, xr.Dataset) else xr.open_dataset(cube)
    where = cube if not isinstance(cube, xr.Dataset) else "cube"
    for v in ("text_a", "text_b", "n_utterances", "task_index"):
        if v not in ds.variables:
            raise JudgeError(f"{where}: variable or coordinate {v!r} is missing")
    by_index = {int(t.index): t for t in tasks.tasks}
    text_a = ds["text_a"].transpose("episode", "sim_seed", "round").values
    text_b = ds["text_b"].transpose("episode", "sim_seed", "round").values
    n_utt = ds["n_utterances"].transpose("episode", "sim_seed").values
    episodes = ds["episode"].values if "episode" in ds.coords else np.arange(ds.sizes["episode"])
    seeds = ds["sim_seed"].values if "sim_seed" in ds.coords else np.arange(ds.sizes["sim_seed"])
    task_idx = ds["task_index"].values
    items = []
    for e, ep in enumerate(episodes):
        ti = int(task_idx[e])
        if ti not in by_index:
            raise JudgeError(f"{where}: episode {ep} has task_index {ti}, which is not in the "
                             f"task set ({len(by_index)} tasks)")
        task = by_index[ti]
        names = tuple(task.names) if layout == "reference" else tuple(name.strip() for name in task.names)
        text = intro(task)
        for s, seed in enumerate(seeds):
            n = n_utt[e, s]
            n = 0 if not np.isfinite(n) or n < 0 else int(n)
            utts = tuple(str((text_a if t % 2 == 0 else text_b)[e, s, t // 2]) for t in range(n))
            items.append(JudgeItem(int(ep), ti, int(seed), text, names, utts, layout))
    if not isinstance(cube, xr.Dataset):
        ds.close()
    return items


def sample_items(items: list[JudgeItem], n: int | None, seed: int = 0) -> list[JudgeItem]:
    """``n`` dialogs drawn without replacement with ``numpy.random.default_rng(seed)``, in the order of ``items``;
    every item for ``n=None`` or ``n >= len(items)``.  Raises :class:`JudgeError` unless ``n`` is a positive integer."""
    if n is None:
        return list(items)
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise JudgeError(f"sample must be a positive number of dialogs, got {n!r}")
    if n >= len(items):
        return list(items)
    keep = np.sort(np.random.default_rng(int(seed)).choice(len(items), size=int(n), replace=False))
    return [items[i] for i in keep]
