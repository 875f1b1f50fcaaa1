"""A dialog of the simulation as one object, and the scheduler that holds the queues of them.

A :class:`Dialog` is a unit (episode, seed) played in one view (``"active"`` or ``"tom"``) with its :class:`Status`::

    WAITING --schedule--> RUNNING --reply, goes on--> WAITING
                             `--reply, ends--> FINISHED

A :class:`Scheduler` holds the dialogs in play in queues by status (as nano-vllm's scheduler holds its sequences):
those of one part or, with continuous scheduling, of the parts in play, which join (:meth:`Scheduler.add`) as the
stream has room and leave (:meth:`Scheduler.remove`) with their part.  The loop of :mod:`synclib.simulate.runner`
repeats: :meth:`~Scheduler.schedule` the waiting dialogs, run one stream step per model, hand replies back
(:meth:`~Scheduler.replied`), record them and :meth:`~Scheduler.advance` or :meth:`~Scheduler.finish` each dialog.
"""
from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from synclib.cube import Unit
from synclib.keys import SCHEDULING

__all__ = ["Status", "Dialog", "Scheduler"]


class Status(enum.Enum):
    """Where a :class:`Dialog` stands."""

    WAITING = "waiting"            #: its next utterance is due, not yet submitted
    RUNNING = "running"            #: a request of it is in flight
    FINISHED = "finished"          #: ended and read; its sessions forgotten


@dataclass(eq=False)
class Dialog:
    """One dialog: a unit (episode, seed) in one view, filling ``cells`` (its cube cells).

    Attributes
    ----------
    cells : Unit
        The unit's cube cells (:class:`synclib.cube.Unit`: episode, seed and values); the dialog writes its view's
        variables.
    view : {"active", "tom"}
        The prompt view its speakers read (:data:`synclib.tasks.prompts.VIEWS`): ``"active"`` for a genuine dialog.
    history : list of str, the post-processed utterances so far
    turn : int, the utterance it is at (agent ``turn % 2`` speaks)
    request : Request or None, the request of ``turn`` in flight
    reads : int, its passive reads in flight (the continuous loop reads them with its requests)
    """

    cells: Unit
    view: str
    history: list = field(default_factory=list)
    turn: int = 0
    request: object = None
    reads: int = 0
    status: Status = Status.WAITING

    @property
    def unit(self) -> tuple[int, int]:
        """(task index, simulation seed): its cells' episode and seed."""
        return self.cells.episode, self.cells.seed

    @property
    def agent(self) -> int:
        """The agent who speaks at ``turn`` (0: agent 1, 1: agent 2)."""
        return self.turn % 2

    def session(self, agent: int, view: str | None = None) -> tuple:
        """``agent``'s engine session ``(task index, seed, agent, view)``, in the dialog's view or ``view``."""
        return self.unit[0], self.unit[1], agent, view or self.view


class Scheduler:
    """The queues of the dialogs in play (waiting, running, finished) and the policy that moves them.

    Parameters
    ----------
    dialogs : sequence of Dialog, optional
        The first dialogs (:meth:`add`).
    policy : {"turns", "continuous"}, default "continuous"
        The config's ``simulate.scheduling``.  ``"turns"``: waiting dialogs are scheduled only when none is running,
        and a turn's replies are handed back together when its last has come, in scheduling order, so the next turn
        starts from what every dialog said.  ``"continuous"``: a waiting dialog is scheduled at once and its reply
        handed back as it comes.
    """

    def __init__(self, dialogs=(), policy: str = "continuous"):
        if policy not in SCHEDULING:
            raise ValueError(f"policy must be one of {', '.join(map(repr, SCHEDULING))}, got {policy!r}")
        self.policy = policy
        self.dialogs: list[Dialog] = []
        self.waiting: deque[Dialog] = deque()
        self.running: dict[int, Dialog] = {}
        self.finished: list[Dialog] = []
        self._replies: dict[int, object] = {}
        self.add(dialogs)

    def __bool__(self) -> bool:
        """Dialogs still to speak or speaking."""
        return bool(self.waiting or self.running)

    def add(self, dialogs) -> None:
        """New WAITING dialogs (at their first utterance) join the waiting queue; requests go out in this order."""
        dialogs = list(dialogs)
        for d in dialogs:
            if d.status is not Status.WAITING:
                raise ValueError(f"a new dialog must be WAITING, {d.unit} {d.view} is {d.status.name}")
        self.dialogs += dialogs
        self.waiting.extend(dialogs)

    def remove(self, dialogs) -> None:
        """FINISHED dialogs leave the scheduler (their part is done), which then holds none of them."""
        gone = {id(d) for d in dialogs}
        for d in dialogs:
            if d.status is not Status.FINISHED:
                raise ValueError(f"only a finished dialog can leave, {d.unit} {d.view} is {d.status.name}")
        self.dialogs = [d for d in self.dialogs if id(d) not in gone]
        self.finished = [d for d in self.finished if id(d) not in gone]

    def schedule(self) -> list[Dialog]:
        """The waiting dialogs, in order, now RUNNING (to be submitted); with ``policy="turns"`` none while one runs."""
        if self.policy == "turns" and self.running:
            return []
        out = list(self.waiting)
        self.waiting.clear()
        for d in out:
            d.status = Status.RUNNING
            self.running[id(d)] = d
        return out

    def replied(self, d: Dialog, reply) -> list[tuple[Dialog, object]]:
        """Running dialog ``d``'s ``reply`` came back: the (dialog, reply) pairs to postprocess now (then
        :meth:`advance` or :meth:`finish` each): this one (``"continuous"``), or with ``"turns"`` every running
        dialog's once the last has replied, in scheduling order, else none."""
        if id(d) not in self.running:
            raise ValueError(f"dialog {d.unit} {d.view} is not running ({d.status.name})")
        if self.policy == "continuous":
            return [(d, reply)]
        self._replies[id(d)] = reply
        if len(self._replies) < len(self.running):
            return []
        out = [(x, self._replies[k]) for k, x in self.running.items()]
        self._replies = {}
        return out

    def _leave_running(self, d: Dialog) -> None:
        if self.running.pop(id(d), None) is None:
            raise ValueError(f"dialog {d.unit} {d.view} is not running ({d.status.name})")

    def advance(self, d: Dialog) -> None:
        """A running dialog goes on: its next utterance waits to be scheduled."""
        self._leave_running(d)
        d.turn += 1
        d.request = None
        d.status = Status.WAITING
        self.waiting.append(d)

    def finish(self, d: Dialog) -> None:
        """A running dialog ended."""
        self._leave_running(d)
        d.status = Status.FINISHED
        self.finished.append(d)
