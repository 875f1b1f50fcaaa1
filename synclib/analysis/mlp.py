"""The nonlinear comparator of appendix I: a two-layer MLP from one source layer to
one target layer, scored by test R^2 like the ridge maps."""
from __future__ import annotations

import inspect

import numpy as np
import torch

__all__ = ["mlp_r2", "mlp_r2_batch", "mlp_defaults"]


def mlp_r2(Xtr, Ytr, Xte, Yte, *, hidden: int = 512, lr: float = 1e-4, weight_decay: float = 0.1,
           epochs: int = 200, batch_size: int | None = 64, seed: int = 0, device=None) -> float:
    """Test R^2 of a 2-layer MLP (appendix I).

    Linear-ReLU-Linear with ``hidden`` units, trained with AdamW (``lr``,
    ``weight_decay``) for ``epochs`` on MSE.  Inputs and targets are standardised
    with training statistics (the paper does not say; R^2 is unaffected by the
    target rescaling, which is undone before scoring).  ``batch_size=None`` trains
    full-batch (one step per epoch); the default uses shuffled minibatches of 64
    (the paper does not say either).  One map of :func:`mlp_r2_batch`.

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
    f = lambda a: np.asarray(a)[None]  # noqa: E731
    return float(mlp_r2_batch(f(Xtr), f(Ytr), f(Xte), f(Yte), hidden=hidden, lr=lr, weight_decay=weight_decay,
                              epochs=epochs, batch_size=batch_size, seed=seed, device=device)[0])


def mlp_r2_batch(Xtr, Ytr, Xte, Yte, *, hidden: int = 512, lr: float = 1e-4, weight_decay: float = 0.1,
                 epochs: int = 200, batch_size: int | None = 64, seed: int = 0, device=None) -> np.ndarray:
    """Test R^2 of ``P`` MLPs trained side by side on the same samples (e.g. several layer
    pairs of one split): each is exactly the :func:`mlp_r2` of its own arrays.

    The ``P`` maps share the sample rows, so they share the initialisation (the same
    ``torch.manual_seed(seed)`` draw of one Linear-ReLU-Linear) and the minibatch order;
    their parameters are disjoint, the loss is the sum of their MSEs and AdamW works
    element-wise, so training them as one batched network (``torch.baddbmm``) gives each the
    updates it gets alone, up to float rounding, in one step per minibatch instead of ``P``.

    Parameters
    ----------
    Xtr : array, shape (P, n_train, D_src)
    Ytr : array, shape (P, n_train, D_tgt)
    Xte : array, shape (P, n_test, D_src)
    Yte : array, shape (P, n_test, D_tgt)
    hidden, lr, weight_decay, epochs, batch_size, seed, device : as :func:`mlp_r2`.

    Returns
    -------
    numpy.ndarray
        ``(P,)`` float64: each map's test R^2 (uniform average over its target columns).
    """
    dev = torch.device(device or "cpu")
    g = torch.Generator().manual_seed(seed)
    f = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    Xtr, Ytr, Xte, Yte = f(Xtr), f(Ytr), f(Xte), f(Yte)
    if Xtr.ndim != 3 or Ytr.ndim != 3 or Xte.ndim != 3 or Yte.ndim != 3:
        raise ValueError("mlp_r2_batch: Xtr, Ytr, Xte, Yte must be 3-D (maps, samples, features)")
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

    # torch's fused AdamW: one pass over each parameter's memory instead of one per operation
    # (the same update up to float rounding; 20 % less time measured on 2 CPU cores)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=dev.type in ("cpu", "cuda") or None)
    n = xtr.shape[1]
    bs = n if batch_size is None else int(batch_size)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g).to(dev)
        for s in range(0, n, bs):
            idx = perm[s:s + bs]
            opt.zero_grad(set_to_none=True)
            loss = ((net(xtr[:, idx]) - ytr[:, idx]) ** 2).mean(dim=(1, 2)).sum()
            loss.backward()
            opt.step()
    with torch.no_grad():
        pred = (net(((Xte - mx) / sx).to(dev)).cpu() * sy + my).double()
    y = Yte.double()
    ss_res = ((y - pred) ** 2).sum(1)
    ss_tot = ((y - y.mean(1, keepdim=True)) ** 2).sum(1)
    const = ss_tot == 0
    r2 = torch.where(const, (ss_res == 0).double(), 1 - ss_res / torch.where(const, 1.0, ss_tot))
    return r2.mean(1).numpy()


def mlp_defaults() -> dict:
    """The MLP settings of :func:`mlp_r2` by default: ``hidden``, ``lr``, ``weight_decay``,
    ``epochs``, ``batch_size`` (read from its signature, so they cannot drift)."""
    params = inspect.signature(mlp_r2).parameters
    return {name: p.default for name, p in params.items()
            if p.kind is p.KEYWORD_ONLY and name not in ("seed", "device")}
