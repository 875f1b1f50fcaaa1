"""Benchmark: batched ridge R^2 grids (synclib.analysis.ridge.r2_grid) vs the paper's
per-layer-pair ridge, written faithfully as a baseline.

Baseline (the paper's "manually implemented ridge regression", one solve per
layer pair): augment X with a column of ones, solve
``(X~'X~ + lambda diag(1, ..., 1, 0)) W = X~'Y`` (intercept unpenalised) in
float32, predict, ``R^2`` uniform average over target columns.

Modes
-----
default (CPU, the embedded scale): SmolLM2-like shapes, 30 layers x 576, n samples
    (``--n``, default 2000) with planted low-rank structure; times
    * ours: the full two-direction grid (A->B and B->A) for 3 split seeds,
    * baseline: one grid (one direction, one seed; ``--baseline-grids`` for more),
    and reports the per-grid ratio measured in the same run.
``--paper-scale``: 6,500 samples, 32 x 32 layers, 4096 wide, 3 split seeds, one
    direction, on ``--device`` (default cuda if available).  Times float32, tf32
    and bf16 (CUDA only) and the baseline (``--baseline-seeds``, default 1, the
    3-seed time is extrapolated and marked so), with max |difference| of every
    grid against float32, the baseline and a float64 reference on sampled pairs.

Needs only numpy, torch and synclib.analysis.ridge.  Writes JSON into bench/results/.

    python bench/bench_ridge.py                 # CPU embedded scale
    python bench/bench_ridge.py --paper-scale   # GPU
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from synclib.analysis.ridge import ComputeOptions, r2_grid, ridge_solve  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device):
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t


def baseline_pair(Xtr, Ytr, Xte, Yte, alpha):
    """The paper's ridge for one layer pair (float32, augmented intercept)."""
    n, d = Xtr.shape
    ones = torch.ones(n, 1, dtype=Xtr.dtype, device=Xtr.device)
    Xa = torch.cat([Xtr, ones], 1)
    A = Xa.T @ Xa
    pen = torch.full((d + 1,), alpha, dtype=Xtr.dtype, device=Xtr.device)
    pen[-1] = 0
    A += torch.diag(pen)
    W = torch.linalg.solve(A, Xa.T @ Ytr)
    pred = Xte @ W[:-1] + W[-1]
    ss_res = ((Yte - pred) ** 2).sum(0)
    ss_tot = ((Yte - Yte.mean(0)) ** 2).sum(0)
    return float((1 - ss_res / ss_tot).mean())


def baseline_grid(X, Y, tr, te, alpha):
    Ls, Lt = X.shape[1], Y.shape[1]
    out = np.zeros((Ls, Lt))
    for i in range(Ls):
        Xtr, Xte = X[tr, i].float(), X[te, i].float()
        for j in range(Lt):
            out[i, j] = baseline_pair(Xtr, Y[tr, j].float(), Xte, Y[te, j].float(), alpha)
    return out


def reference64(X, Y, tr, te, alpha, pairs):
    """float64 centred ridge on a few (i, j) pairs (accuracy reference)."""
    out = {}
    for i, j in pairs:
        Xtr, Xte = X[tr, i].double(), X[te, i].double()
        Ytr, Yte = Y[tr, j].double(), Y[te, j].double()
        mx, my = Xtr.mean(0), Ytr.mean(0)
        Xc = Xtr - mx
        n, d = Xc.shape
        if d <= n:
            A = Xc.T @ Xc + alpha * torch.eye(d, dtype=torch.float64, device=X.device)
            pred = (Xte - mx) @ torch.linalg.solve(A, Xc.T @ (Ytr - my)) + my
        else:
            K = Xc @ Xc.T + alpha * torch.eye(n, dtype=torch.float64, device=X.device)
            pred = (Xte - mx) @ (Xc.T @ torch.linalg.solve(K, Ytr - my)) + my
        ss_res = ((Yte - pred) ** 2).sum(0)
        ss_tot = ((Yte - Yte.mean(0)) ** 2).sum(0)
        out[(i, j)] = float((1 - ss_res / ss_tot).mean())
    return out


def make_data(n, L, D, device, seed=0, rank=64, noise=1.0):
    """Hidden-state-like data: shared low-rank latent, per-layer mixing,
    anisotropic feature scales, the target one step ahead of the source."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    z = torch.randn(n, rank, generator=g)
    z_next = 0.8 * z + 0.6 * torch.randn(n, rank, generator=g)

    def states(latent):
        out = torch.empty(n, L, D, dtype=torch.float32, device=device)
        for l in range(L):
            P = torch.randn(rank, D, generator=g) / rank ** 0.5
            scale = torch.exp(torch.randn(D, generator=g) * 0.5)
            s = 0.4 + np.sin(np.pi * l / max(L - 1, 1))
            out[:, l] = ((s * latent @ P + noise * torch.randn(n, D, generator=g)) * scale).to(device)
        return out

    return states(z), states(z_next)


def splits(n, seeds, test_frac=0.2):
    out = []
    for s in seeds:
        p = np.random.default_rng(s).permutation(n)
        k = int(round(test_frac * n))
        out.append((p[k:], p[:k]))
    return out


def env_info(device):
    info = {"torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "device": str(device)}
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    try:
        info["loadavg_1min"] = os.getloadavg()[0]
    except OSError:
        pass
    return info


def bench_cpu(args):
    device = torch.device(args.device or "cpu")
    L, D = 30, 576
    A, B = make_data(args.n + 1, L, D, device, seed=0)
    # A->B pairs A[t] with B[t]; B->A pairs B[t] with A[t+1] (a different target row)
    n = args.n
    seeds = (0, 1, 2)
    sp = splits(n, seeds)
    res = {"mode": "cpu-embedded", "n_samples": n, "layers": L, "width": D, "alpha": args.alpha,
           "split_seeds": list(seeds), "env": env_info(device)}
    # warm-up
    r2_grid(A[:200, :2], B[:200, :2], np.arange(160), np.arange(160, 200), args.alpha)
    grids = {}

    def ours_all():
        for s, (tr, te) in zip(seeds, sp):
            grids[("A->B", s)] = r2_grid(A, B, tr, te, args.alpha).r2
            grids[("B->A", s)] = r2_grid(B, A, (tr, tr + 1), (te, te + 1), args.alpha).r2

    _, t_ours = timed(ours_all, device)
    res["ours_full_two_direction_3_seeds_s"] = t_ours
    res["ours_per_grid_s"] = t_ours / 6
    tr, te = sp[0]
    nb = args.baseline_grids
    base, t_base = timed(lambda: [baseline_grid(A, B, tr, te, args.alpha) for _ in range(nb)][0], device)
    res["baseline_per_grid_s"] = t_base / nb
    res["baseline_full_two_direction_3_seeds_s_extrapolated"] = 6 * t_base / nb
    res["speedup_per_grid"] = (t_base / nb) / (t_ours / 6)
    g = grids[("A->B", 0)]
    res["max_abs_diff_vs_baseline"] = float(np.abs(g - base).max())
    pairs = [(0, 0), (L // 2, L // 2), (L - 1, 3), (5, L - 1)]
    ref = reference64(A, B, torch.as_tensor(tr), torch.as_tensor(te), args.alpha, pairs)
    res["max_abs_diff_vs_float64_reference"] = float(max(abs(g[i, j] - v) for (i, j), v in ref.items()))
    res["baseline_max_abs_diff_vs_float64_reference"] = float(max(abs(base[i, j] - v) for (i, j), v in ref.items()))
    res["sync_r2_example"] = float(np.maximum(0, g.max(1)).mean())
    return res


def _old_hat(Xtr, Xte, alpha, Ytr=None, *, form="predict"):
    """The hat matrix as synclib computed it before 2026-11-26 (primal solves with the n_train
    training rows as right-hand sides): the same-run baseline of the smaller-side solve."""
    if form != "hat":
        return ridge_solve(Xtr, Xte, alpha, Ytr, form=form)
    mx = Xtr.mean(0, keepdim=True)
    Xc, Xt = Xtr - mx, Xte - mx
    if Xc.shape[1] > Xc.shape[0]:
        return ridge_solve(Xtr, Xte, alpha, form="hat")
    A = Xc.T @ Xc
    A.diagonal().add_(alpha)
    return Xt @ torch.cholesky_solve(Xc.T.contiguous(), torch.linalg.cholesky(A))


def stage_times(X, Y, tr, te, alpha, precision, device):
    """One split seed's grid in its two stages: the source side (one factorisation per source
    layer, hat matrices) and the scoring (gram or direct), each timed."""
    from synclib.analysis import ridge as R

    cdtype = torch.bfloat16 if precision == "bf16" else torch.float32
    Ls, D = X.shape[1], X.shape[2]
    method = R._choose_method("auto", Ls, D, Y.shape[1] * Y.shape[2], tr.numel(), te.numel(), 8 << 30)
    use_left = method == "direct" and D * (tr.numel() + te.numel()) < te.numel() * tr.numel()
    with R._matmul_precision(precision, device):
        src, t_src = timed(lambda: R._source_side(X, tr, te, lambda Xl, l: alpha, cdtype, use_left), device)
        _, t_score = timed(lambda: R._score(src, method, Y, tr, te, cdtype, 1 << 30), device)
    return {"method": method, "source_side_s": t_src, "scoring_s": t_score}


def micro_ops(X, tr, te, device, alpha=0.1, reps=3):
    """Per-operation times (ms) of one source layer's solve at this scale: the Gram matrix,
    the Cholesky factorisation and the triangular solves in float64, float32 and TF32, and
    the factorisations of several layers batched against one at a time."""
    out = {}
    Xtr, Xte = X[tr, 0], X[te, 0]

    def ms(fn):
        fn()
        sync(device)
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        sync(device)
        return round(1000 * (time.perf_counter() - t) / reps, 3)

    old = torch.backends.cuda.matmul.allow_tf32
    try:
        for name, dt, tf32 in (("float64", torch.float64, False), ("float32", torch.float32, False),
                               ("tf32", torch.float32, True)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            Xc = (Xtr - Xtr.mean(0)).to(dt)
            Xt = (Xte - Xtr.mean(0)).to(dt)
            out[f"gram_XcT_Xc_{name}"] = ms(lambda: Xc.T @ Xc)
            if name == "tf32":
                XcT = Xc.T.contiguous()
                out[f"hat_gemm_{name}"] = ms(lambda: Xt @ XcT)
                continue
            A = Xc.T @ Xc
            A.diagonal().add_(alpha)
            Lf = torch.linalg.cholesky(A)
            out[f"cholesky_{name}"] = ms(lambda: torch.linalg.cholesky(A))
            XcT, XtT = Xc.T.contiguous(), Xt.T.contiguous()
            out[f"solve_rhs_n_train_{name}"] = ms(lambda: torch.cholesky_solve(XcT, Lf))
            out[f"solve_rhs_n_test_{name}"] = ms(lambda: torch.cholesky_solve(XtT, Lf))
            out[f"solve_rhs_n_test_{name}_two_trsm"] = ms(lambda: torch.linalg.solve_triangular(
                Lf.mT, torch.linalg.solve_triangular(Lf, XtT, upper=False), upper=True))
            out[f"hat_gemm_{name}"] = ms(lambda: Xt @ XcT)
            if name == "float64" and device.type == "cuda":
                k = 8
                Ab = A.expand(k, *A.shape).contiguous()
                out[f"cholesky_{name}_batch_of_{k}"] = ms(lambda: torch.linalg.cholesky(Ab))
                out[f"cholesky_{name}_{k}_one_at_a_time"] = ms(lambda: [torch.linalg.cholesky(Ab[i]) for i in range(k)])
                del Ab
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    out["hat_old_form_float64"] = ms(lambda: _old_hat(Xtr.double(), Xte.double(), alpha, form="hat"))
    out["hat_float64"] = ms(lambda: ridge_solve(Xtr.double(), Xte.double(), alpha, form="hat"))
    return out


def bench_paper(args):
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(dev)
    n, L, D = 6500, 32, 4096
    if args.small:  # a quick run of the same code path (for testing the script)
        n, L, D = 650, 4, 256
    X, Y = make_data(n, L, D, device, seed=0)
    seeds = (0, 1, 2)
    sp = [(torch.as_tensor(tr, device=device), torch.as_tensor(te, device=device)) for tr, te in splits(n, seeds)]
    res = {"mode": "paper-scale", "n_samples": n, "layers": L, "width": D, "alpha": args.alpha,
           "split_seeds": list(seeds), "direction": "one (A->B)", "env": env_info(device)}
    precisions = ["float32"] + (["tf32", "bf16"] if device.type == "cuda" else [])
    if args.precisions:
        precisions = [p for p in args.precisions.split(",") if p in precisions]
    r2_grid(X[:, :2], Y[:, :2], sp[0][0], sp[0][1], args.alpha, compute=ComputeOptions(device=device))  # warm-up
    grids = {}
    for prec in precisions:
        out, t = timed(lambda: [r2_grid(X, Y, tr, te, args.alpha, compute=ComputeOptions(prec, device)).r2
                                for tr, te in sp], device)
        grids[prec] = out
        res[f"ours_{prec}_3_seeds_s"] = t
        if device.type == "cuda":
            res[f"ours_{prec}_peak_gpu_mem_GiB"] = torch.cuda.max_memory_allocated(device) / 2 ** 30
            torch.cuda.reset_peak_memory_stats(device)
    # the same run's baseline: the hat matrices as computed before (n_train right-hand sides)
    from synclib.analysis import ridge as R

    old_prec = "tf32" if "tf32" in precisions else precisions[0]
    R.ridge_solve, new_solve = _old_hat, R.ridge_solve
    try:
        old_grids, t = timed(lambda: [r2_grid(X, Y, tr, te, args.alpha, compute=ComputeOptions(old_prec, device)).r2
                                      for tr, te in sp], device)
    finally:
        R.ridge_solve = new_solve
    res["old_hat_precision"] = old_prec
    res["old_hat_3_seeds_s"] = t
    res["max_abs_diff_old_hat_vs_new"] = float(max(np.abs(a - b).max()
                                                   for a, b in zip(old_grids, grids[res["old_hat_precision"]])))
    res["stages_one_seed"] = {p: stage_times(X, Y, sp[0][0], sp[0][1], args.alpha, p, device) for p in precisions}
    res["micro_ms"] = micro_ops(X, sp[0][0], sp[0][1], device, args.alpha)
    print(json.dumps({k: res[k] for k in ("stages_one_seed", "micro_ms")}, indent=1), flush=True)
    for prec in precisions[1:] if precisions[0] == "float32" else []:
        res[f"max_abs_diff_{prec}_vs_float32"] = float(max(np.abs(a - b).max()
                                                           for a, b in zip(grids[prec], grids["float32"])))
    pairs = [(0, 0), (L // 2, L // 2), (L - 1, 0), (1, L - 1)]
    ref = reference64(X, Y, sp[0][0], sp[0][1], args.alpha, pairs)
    for prec in precisions:
        res[f"max_abs_diff_{prec}_vs_float64_reference"] = float(
            max(abs(grids[prec][0][i, j] - v) for (i, j), v in ref.items()))
    nb = max(0, min(3, args.baseline_seeds))
    if nb == 0:
        return res
    base = []
    _, t_base = timed(lambda: base.extend(baseline_grid(X, Y, tr, te, args.alpha) for tr, te in sp[:nb]), device)
    res["baseline_seeds_run"] = nb
    res["baseline_3_seeds_s" + ("" if nb == 3 else "_extrapolated")] = t_base * 3 / nb
    res["baseline_per_pair_ms"] = 1000 * t_base / (nb * L * L)
    for prec in precisions:
        res[f"max_abs_diff_{prec}_vs_baseline"] = float(max(np.abs(grids[prec][i] - base[i]).max()
                                                            for i in range(nb)))
        res[f"speedup_{prec}_vs_baseline"] = res["baseline_3_seeds_s" + ("" if nb == 3 else "_extrapolated")] \
            / res[f"ours_{prec}_3_seeds_s"]
    res["baseline_max_abs_diff_vs_float64_reference"] = float(max(abs(base[0][i, j] - v) for (i, j), v in ref.items()))
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paper-scale", action="store_true", help="6,500 x 32 x 32 x 4096, 3 seeds, one direction")
    p.add_argument("--small", action="store_true", help="with --paper-scale: tiny shapes (checks the script)")
    p.add_argument("--device", default=None, help="torch device (default: cpu; cuda for --paper-scale if available)")
    p.add_argument("--precisions", default=None, help="paper scale: comma list of float32, tf32, bf16 (default: all)")
    p.add_argument("--n", type=int, default=2000, help="samples at the embedded scale (default: %(default)s)")
    p.add_argument("--alpha", type=float, default=0.1, help="ridge penalty (default: %(default)s)")
    p.add_argument("--baseline-grids", type=int, default=1, help="CPU: baseline grids timed (default: %(default)s)")
    p.add_argument("--baseline-seeds", type=int, default=1,
                   help="paper scale: split seeds the per-pair baseline runs, the rest extrapolated; 0: none "
                        "(default: %(default)s)")
    p.add_argument("--out", default=None, help="JSON path (default: bench/results/ridge_<mode>_<device>.json)")
    args = p.parse_args(argv)
    res = bench_paper(args) if args.paper_scale else bench_cpu(args)
    res["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
    name = f"ridge_{'paper' if args.paper_scale else 'embedded'}{'_small' if args.small else ''}_" \
           f"{res['env']['device'].split(':')[0]}.json"
    out = Path(args.out) if args.out else RESULTS / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
