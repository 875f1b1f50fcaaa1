"""The nonlinear comparator of appendix I: a two-layer MLP from one source layer to
one target layer, scored by test R^2 like the ridge maps."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np
import torch

from synclib.analysis.ridge import GroupLoss, _group_codes
from synclib.keys import Settings, default, integer, number

__all__ = ["mlp_r2", "mlp_r2_batch", "mlp_defaults", "MLPOptions", "STOPPING_RULE"]


@dataclass(frozen=True)
class MLPOptions(Settings):
    """The MLP of appendix I and its training, checked when made (errors name the field and any config key).

    hidden : hidden units of the Linear-ReLU-Linear network.  lr, weight_decay : AdamW's learning rate (> 0) and
    weight decay (>= 0).  epochs (``analysis.nonlinear_epochs``) : training epochs; with a validation part the most
    (:data:`STOPPING_RULE`).  batch_size (``analysis.nonlinear_batch_size``) : minibatch size; None: full batch.
    patience : epochs without a better validation MSE before early stopping.
    """

    KEYS: ClassVar[dict[str, str]] = {"epochs": "analysis.nonlinear_epochs",
                                      "batch_size": "analysis.nonlinear_batch_size"}

    hidden: int = 512
    lr: float = 1e-4
    weight_decay: float = 0.1
    epochs: int = default("analysis.nonlinear_epochs")
    batch_size: int | None = default("analysis.nonlinear_batch_size")
    patience: int = 20

    def __post_init__(self):
        self._check()
        self._check_own(hidden=integer(1), patience=integer(1), lr=number(0, lo_open=True), weight_decay=number(0))

    @classmethod
    def of(cls, options) -> "MLPOptions":
        """``options`` as MLPOptions: as it is, None (the defaults) or a dict of fields."""
        if isinstance(options, cls):
            return options
        if options is None:
            return cls()
        if not isinstance(options, dict):
            raise ValueError(f"nonlinear_options must be MLPOptions or a dict of its fields, got {options!r}")
        unknown = sorted(set(options) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"nonlinear_options: unknown option(s) {unknown}; known: {list(cls.__dataclass_fields__)}")
        return cls(**options)


def mlp_r2(Xtr, Ytr, Xte, Yte, options: MLPOptions | None = None, *, seed: int = 0, device=None) -> float:
    """Test R^2 of a 2-layer MLP (appendix I): one map of :func:`mlp_r2_batch`, on arrays ``Xtr`` (n_train, D_src),
    ``Ytr`` (n_train, D_tgt), ``Xte`` (n_test, D_src), ``Yte`` (n_test, D_tgt).

    Linear-ReLU-Linear with ``options.hidden`` units (default ``MLPOptions()``), trained with AdamW on MSE, inputs
    and targets standardised with training statistics (the paper does not say; R^2 is unaffected, the target
    rescaling being undone before scoring), in shuffled minibatches of ``batch_size`` (nor does it say that);
    ``seed`` sets the initialisation and minibatch order, ``device`` defaults to CPU.  Returns the test R^2,
    uniform average over the target columns (as scikit-learn).
    """
    f = lambda a: np.asarray(a)[None]  # noqa: E731
    return float(mlp_r2_batch(f(Xtr), f(Ytr), f(Xte), f(Yte), options, seed=seed, device=device)[0])


def mlp_r2_batch(Xtr, Ytr, Xte, Yte, options: MLPOptions | None = None, *, seed: int = 0, device=None,
                 val=None, return_epochs: bool = False, test_groups=None):
    """Test R^2 of ``P`` MLPs trained side by side on the same samples (e.g. several layer pairs of one split), each
    exactly the :func:`mlp_r2` of its own arrays: they share the initialisation (one ``torch.manual_seed(seed)``
    draw) and minibatch order, their parameters are disjoint, the loss is the sum of their MSEs and AdamW works
    element-wise, so one batched network (``torch.baddbmm``) gives each the updates it gets alone, up to rounding.

    With ``val`` the epochs are chosen by early stopping (:data:`STOPPING_RULE`): the maps train on the rows outside
    ``val``, each map's validation MSE is read after every epoch and training stops once none has improved for
    ``patience`` epochs (or at ``epochs``); each map is then trained again, from the same initialisation and
    minibatch seed, on all training rows for its best epoch count.  Without it every map trains ``options.epochs``.

    Parameters
    ----------
    Xtr, Ytr, Xte, Yte : arrays (P, n_train, D_src), (P, n_train, D_tgt), (P, n_test, D_src), (P, n_test, D_tgt)
    options, seed, device : as :func:`mlp_r2`.
    val : int array, optional
        Training rows of the validation part (whole episodes, e.g. :func:`synclib.splits.validation_split`).
    return_epochs : bool
        Also return each map's epochs on all rows, (P,) int.
    test_groups : array (n_test,), optional
        A group label per test sample (e.g. its episode): also return each group's share of the test loss, a
        :class:`synclib.analysis.ridge.GroupLoss` with ``loss`` (G, P), as the ridge grids give it for the episode
        bootstrap (:func:`synclib.analysis.ridge.resampled_r2`).

    Returns each map's test R^2, (P,) float64, uniform average over its target columns; then the epochs and the
    group losses where asked for.
    """
    dev = torch.device(device or "cpu")
    f = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    Xtr, Ytr, Xte, Yte = f(Xtr), f(Ytr), f(Xte), f(Yte)
    if Xtr.ndim != 3 or Ytr.ndim != 3 or Xte.ndim != 3 or Yte.ndim != 3:
        raise ValueError("mlp_r2_batch: Xtr, Ytr, Xte, Yte must be 3-D (maps, samples, features)")
    P = Xtr.shape[0]
    options = MLPOptions.of(options)
    if val is not None:
        val = np.asarray(val, dtype=np.int64)
        part = np.setdiff1d(np.arange(Xtr.shape[1]), val)
        stops = _train(Xtr[:, part], Ytr[:, part], np.full(P, options.epochs), options, seed=seed, dev=dev,
                       val=(Xtr[:, val], Ytr[:, val]))[1]
    else:
        stops = np.full(P, int(options.epochs))
    net, _, scale = _train(Xtr, Ytr, stops, options, seed=seed, dev=dev)
    mx, sx, my, sy = scale
    with torch.no_grad():
        pred = (net(((Xte - mx) / sx).to(dev)).cpu() * sy + my).double()
    y = Yte.double()
    ss_res = ((y - pred) ** 2).sum(1)
    ss_tot = ((y - y.mean(1, keepdim=True)) ** 2).sum(1)
    const = ss_tot == 0
    r2 = torch.where(const, (ss_res == 0).double(), 1 - ss_res / torch.where(const, 1.0, ss_tot))
    out = r2.mean(1).numpy()
    extra = (stops,) if return_epochs else ()
    if test_groups is not None:
        extra += (_group_loss((y - pred) ** 2 / torch.where(const, torch.inf, ss_tot)[:, None], test_groups),)
    return (out, *extra) if extra else out


def _group_loss(weighted, groups):
    """Each group's loss (G, P): the weighted squared residuals ``weighted`` (P, n_test, D_tgt) summed over the
    group's samples, averaged over the target columns."""
    labels, codes = _group_codes(groups, weighted.shape[1])
    per_row = weighted.mean(2).numpy()                                   # (P, n_test)
    loss = np.stack([np.bincount(codes, per_row[p], len(labels)) for p in range(len(per_row))], axis=1)
    return GroupLoss(labels, loss, np.bincount(codes, minlength=len(labels)))


STOPPING_RULE = ("ours (the paper trains 200 epochs): early stopping on the validation part of each split's "
                 "training set (whole episodes, 20 %, synclib.splits.validation_split), patience 20 epochs, at most "
                 "the configured epochs; each map is then trained again on the whole training set for its best "
                 "epoch count (nonlinear_epochs)")


def _train(Xtr, Ytr, stop_at, options: MLPOptions, *, seed: int, dev, val=None):
    """Train the ``P`` batched maps on (P, n, D) rows, each map's parameters kept at epoch ``stop_at[p]``; with
    ``val = (xval, yval)`` ((P, n_val, D)) ``stop_at`` is the most epochs and each map keeps its best validation MSE
    epoch (standardised targets), training ending once none improved for ``options.patience`` epochs.  Returns
    ``(net, epochs (P,) int, (mx, sx, my, sy))``: the network with every map at its kept epoch, the epochs kept and
    the training rows' standardisation."""
    hidden, lr, weight_decay, batch_size = options.hidden, options.lr, options.weight_decay, options.batch_size
    xval, yval = val if val is not None else (None, None)
    g = torch.Generator().manual_seed(seed)
    P = Xtr.shape[0]
    mx, sx = Xtr.mean(1, keepdim=True), Xtr.std(1, keepdim=True).clamp_min(1e-6)
    my, sy = Ytr.mean(1, keepdim=True), Ytr.std(1, keepdim=True).clamp_min(1e-6)
    xtr, ytr = ((Xtr - mx) / sx).to(dev), ((Ytr - my) / sy).to(dev)
    torch.manual_seed(seed)
    proto = torch.nn.Sequential(torch.nn.Linear(xtr.shape[2], hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, ytr.shape[2]))
    # (P, in, out) weights and (P, 1, out) biases, every map starting from the same draw
    params = [t.detach().to(dev).expand(P, *t.shape).clone().requires_grad_()
              for t in (proto[0].weight.T, proto[0].bias[None], proto[2].weight.T, proto[2].bias[None])]
    w1, b1, w2, b2 = params

    def net(x):
        return torch.baddbmm(b2, torch.relu(torch.baddbmm(b1, x, w1)), w2)

    # fused AdamW: one pass over each parameter's memory instead of one per operation (same update up to rounding)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=dev.type in ("cpu", "cuda") or None)
    kept = [t.detach().clone() for t in params]
    most = int(np.max(stop_at, initial=0))
    validate = xval is not None
    if validate:
        xv, yv = ((xval - mx) / sx).to(dev), ((yval - my) / sy).to(dev)
        best = torch.full((P,), float("inf"))
        stop_at = np.zeros(P, dtype=np.int64)
    else:
        stop_at = np.asarray(stop_at, dtype=np.int64)
    n = xtr.shape[1]
    bs = n if batch_size is None else int(batch_size)
    for epoch in range(1, most + 1):
        perm = torch.randperm(n, generator=g).to(dev)
        for s in range(0, n, bs):
            idx = perm[s:s + bs]
            opt.zero_grad(set_to_none=True)
            loss = ((net(xtr[:, idx]) - ytr[:, idx]) ** 2).mean(dim=(1, 2)).sum()
            loss.backward()
            opt.step()
        if validate:
            with torch.no_grad():
                mse = ((net(xv) - yv) ** 2).mean(dim=(1, 2)).cpu()
            mark = mse < best
            best = torch.where(mark, mse, best)
            stop_at[mark.numpy()] = epoch
        else:
            mark = torch.as_tensor(stop_at == epoch)
        if bool(mark.any()):
            with torch.no_grad():
                for k, t in zip(kept, params):
                    k[mark.to(k.device)] = t.detach()[mark.to(k.device)]
        if validate and epoch - int(stop_at.max()) >= options.patience:
            break
    with torch.no_grad():
        for k, t in zip(kept, params):
            t.copy_(k)
    return net, stop_at, (mx, sx, my, sy)


def mlp_defaults() -> dict:
    """The default MLP settings (:class:`MLPOptions`' fields, so they cannot drift)."""
    return asdict(MLPOptions())
