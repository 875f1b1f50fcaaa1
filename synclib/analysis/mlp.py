"""The nonlinear comparator of appendix I: a two-layer MLP from one source layer to
one target layer, scored by test R^2 like the ridge maps."""
from __future__ import annotations

import inspect

import numpy as np
import torch

__all__ = ["mlp_r2", "mlp_defaults"]


def mlp_r2(Xtr, Ytr, Xte, Yte, *, hidden: int = 512, lr: float = 1e-4, weight_decay: float = 0.1,
           epochs: int = 200, batch_size: int | None = 64, seed: int = 0, device=None) -> float:
    """Test R^2 of a 2-layer MLP (appendix I).

    Linear-ReLU-Linear with ``hidden`` units, trained with AdamW (``lr``,
    ``weight_decay``) for ``epochs`` on MSE.  Inputs and targets are standardised
    with training statistics (the paper does not say; R^2 is unaffected by the
    target rescaling, which is undone before scoring).  ``batch_size=None`` trains
    full-batch (one step per epoch); the default uses shuffled minibatches of 64
    (the paper does not say either).

    Parameters
    ----------
    Xtr : array, shape (n_train, D_src)
    Ytr : array, shape (n_train, D_tgt)
    Xte : array, shape (n_test, D_src)
    Yte : array, shape (n_test, D_tgt)
    hidden, lr, weight_decay, epochs, batch_size : the MLP and its training.
    seed : int
        Initialisation and minibatch order.
    device : torch device (default CPU).

    Returns
    -------
    float
        Test R^2, uniform average over the target columns (as scikit-learn).
    """
    dev = torch.device(device or "cpu")
    g = torch.Generator().manual_seed(seed)
    f = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    Xtr, Ytr, Xte, Yte = f(Xtr), f(Ytr), f(Xte), f(Yte)
    mx, sx = Xtr.mean(0), Xtr.std(0).clamp_min(1e-6)
    my, sy = Ytr.mean(0), Ytr.std(0).clamp_min(1e-6)
    xtr, ytr = ((Xtr - mx) / sx).to(dev), ((Ytr - my) / sy).to(dev)
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(xtr.shape[1], hidden), torch.nn.ReLU(),
                              torch.nn.Linear(hidden, ytr.shape[1])).to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    n = xtr.shape[0]
    bs = n if batch_size is None else int(batch_size)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g).to(dev)
        for s in range(0, n, bs):
            idx = perm[s:s + bs]
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(net(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
    with torch.no_grad():
        pred = (net(((Xte - mx) / sx).to(dev)).cpu() * sy + my).double()
    y = Yte.double()
    ss_res = ((y - pred) ** 2).sum(0)
    ss_tot = ((y - y.mean(0)) ** 2).sum(0)
    const = ss_tot == 0
    r2 = torch.where(const, (ss_res == 0).double(), 1 - ss_res / torch.where(const, 1.0, ss_tot))
    return float(r2.mean())


def mlp_defaults() -> dict:
    """The MLP settings of :func:`mlp_r2` by default: ``hidden``, ``lr``, ``weight_decay``,
    ``epochs``, ``batch_size`` (read from its signature, so they cannot drift)."""
    params = inspect.signature(mlp_r2).parameters
    return {name: p.default for name, p in params.items()
            if p.kind is p.KEYWORD_ONLY and name not in ("seed", "device")}
