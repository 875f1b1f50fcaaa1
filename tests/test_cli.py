"""Every sub-command refuses a bad option before any work: exit status 2, a message naming
the option and what it expected, no traceback, nothing written."""
from __future__ import annotations

import pytest

from synclib.cli import main

CASES = [
    ("simulate", ["--model-a", "m", "--out", "{tmp}/x.nc", "--temperature", "-1"], "--temperature", ">= 0"),
    ("simulate", ["--model-a", "m", "--out", "{tmp}/x.nc", "--seeds", "1,1"], "--seeds", "duplicate"),
    ("simulate", ["--model-a", "m", "--out", "{tmp}/x.nc", "--top-p", "1.5"], "--top-p", "(0, 1]"),
    ("simulate", ["--model-a", "m", "--out", "{tmp}/x.nc", "--top-k", "-2"], "--top-k", ">= 0"),
    ("simulate", ["--model-a", "m", "--out", "{tmp}/x.nc", "--units-per-part", "0"], "--units-per-part", ">= 1"),
    ("simulate", ["--model-a", "m", "--out", "{tmp}/x.nc", "--max-rows", "0"], "--max-rows", ">= 1"),
    ("simulate", ["--model-a", "m", "--out", "{tmp}/x.nc", "--max-new-tokens", "abc"], "--max-new-tokens",
     "must be an integer >= 1, got 'abc'"),
    ("simulate", ["--model-a", "m", "--out", "{tmp}/x.nc", "--tasks", "3-1"], "--tasks", "backwards"),
    ("simulate", ["--model-a", "m", "--out", "{tmp}/x.txt"], "--out", "must end in .nc"),
    ("simulate", ["--model-a", "m", "--out", "{tmp}/missing/x.nc"], "--out", "does not exist"),
    ("simulate", ["--model-a", "m", "--out", "{tmp}/x.nc", "--seeds", "0", "--passive-seeds", "1"],
     "--passive-seeds", "not among"),
    ("simulate", ["--model-a", "m", "--out", "{tmp}/x.nc", "--scenarios", "{tmp}/nowhere"], "--scenarios", ""),
    ("analyze", ["{tmp}/c.nc", "--out", "{tmp}/r.nc", "--alpha", "0"], "--alpha", "> 0"),
    ("analyze", ["{tmp}/c.nc", "--out", "{tmp}/r.nc", "--conditions", "genuine,lag0"], "--conditions", "lagK"),
    ("analyze", ["{tmp}/c.nc", "--out", "{tmp}/r.nc", "--split-seeds", ""], "--split-seeds", "empty"),
    ("analyze", ["{tmp}/c.nc", "--out", "{tmp}/r.nc", "--n-samples", "-1"], "--n-samples", ">= 2, got -1"),
    # "0 means all" options: 0 is the key's null, anything else the key's check (one sample is not a dataset)
    ("analyze", ["{tmp}/c.nc", "--out", "{tmp}/r.nc", "--n-samples", "1"], "--n-samples", ">= 2, got 1"),
    ("analyze", ["{tmp}/c.nc", "--out", "{tmp}/r.nc", "--cv-columns", "-1"], "--cv-columns", "got -1"),
    ("analyze", ["{tmp}/c.nc", "--out", "{tmp}/r.nc", "--nonlinear-seeds", "-1"], "--nonlinear-seeds", "got -1"),
    ("analyze", ["{tmp}/c.nc", "--out", "{tmp}/r.nc", "--max-resident-gib", "-1"], "--max-resident-gib", ">= 0"),
    ("analyze", ["{tmp}/c.nc", "--out", "{tmp}/r.nc", "--nonlinear-epochs", "0"], "--nonlinear-epochs", ">= 1"),
    # a keyed option's error names the value as typed (not as the one-item list it was also tried as)
    ("analyze", ["{tmp}/c.nc", "--out", "{tmp}/r.nc", "--cv-folds", "1"], "--cv-folds",
     "must be an integer >= 2, got 1"),
    ("analyze", ["{tmp}/c.nc", "--out", "{tmp}/r.nc", "--cv-seed", "-3"], "--cv-seed", "got -3"),
    ("simulate", ["--model-a", "m", "--out", "{tmp}/x.nc", "--tom-episodes", "0"], "--tom-episodes", "got 0"),
    ("analyze", ["{tmp}/c.nc", "--out", "{tmp}/r.nc", "--cv-alphas", "0.1,-1"], "--cv-alphas",
     "a non-empty list of numbers > 0, got [0.1, -1]"),
    ("analyze", ["{tmp}/c.nc", "--out", "{tmp}/r.nc", "--surrogates", "-1"], "--surrogates", ">= 0, got -1"),
    ("analyze", ["{tmp}/c.nc", "--out", "{tmp}/r.nc", "--precision", "fp8"], "--precision",
     "one of 'float32', 'tf32', 'bf16', got 'fp8'"),
    ("analyze", ["{tmp}/c.nc", "--out", "{tmp}/r.nc"], "c.nc", "no cube"),
    ("evaluate", ["{tmp}/c.nc", "--judge-model", "j", "--concurrency", "0"], "--concurrency", ">= 1"),
    ("evaluate", ["{tmp}/c.nc", "--judge-model", "j", "--reasoning-max-chars", "5000"], "--reasoning-max-chars",
     "<= 1999"),
    ("evaluate", ["{tmp}/c.nc", "--judge-model", "j", "--sample", "-1"], "--sample", ">= 1"),
    ("evaluate", ["{tmp}/c.nc", "--judge-model", "j", "--mode", "fancy"], "--mode", "one of 'constrained', 'json', got 'fancy'"),
    # the judge's keys (judge.timeout, max_retries, seed, max_tokens, batch_size) by their rules
    ("evaluate", ["{tmp}/c.nc", "--judge-model", "j", "--timeout", "0"], "--timeout", "must be a number > 0, got 0"),
    ("evaluate", ["{tmp}/c.nc", "--judge-model", "j", "--max-retries", "-1"], "--max-retries",
     "must be an integer >= 0, got -1"),
    ("evaluate", ["{tmp}/c.nc", "--judge-model", "j", "--seed", "x"], "--seed", "must be an integer >= 0, got 'x'"),
    ("evaluate", ["{tmp}/c.nc", "--judge-model", "j", "--max-tokens", "0"], "--max-tokens",
     "must be null or an integer >= 1, got 0"),
    ("evaluate", ["{tmp}/c.nc", "--judge-model", "j", "--batch-size", "0"], "--batch-size",
     "must be an integer >= 1, got 0"),
    ("run", ["--set", "simulate.episods=3"], "simulate.episods", "did you mean 'simulate.episodes'"),
    ("run", ["--set", "simulate.temperature=-1"], "simulate.temperature", ">= 0"),
    ("run", ["--steps", "simulate,bake"], "--steps", "bake"),
    ("run", ["--scheduler", "nowhere"], "--scheduler", "address"),
    ("run", ["--config", "{tmp}/none.yaml"], "none.yaml", ""),
]


def test_truncated_or_foreign_cube_is_named(tmp_path, capsys):
    """analyze and evaluate refuse a file that is not a finished cube, naming it."""
    bad = tmp_path / "foreign.nc"
    bad.write_bytes(b"CDF\x01 not really a netCDF file")
    for argv in (["analyze", str(bad), "--out", str(tmp_path / "r.nc")],
                 ["evaluate", str(bad), "--judge-model", "j"]):
        try:
            status = main(argv)
        except SystemExit as exc:
            status = exc.code
        err = capsys.readouterr().err + (status if isinstance(status, str) else "")
        assert status not in (0, None) and "foreign.nc" in err and "not a finished cube" in err, (argv, err)
        assert "Traceback" not in err
    assert not (tmp_path / "r.nc").exists()


@pytest.mark.parametrize("command,args,option,expected", CASES,
                         ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_bad_option_is_refused_before_any_work(command, args, option, expected, tmp_path, capsys):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    before = sorted(tmp_path.rglob("*"))
    try:
        status = main([command, *args])
    except SystemExit as exc:  # argparse's own refusal
        status = exc.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert option in err and expected in err, err
    assert "Traceback" not in err
    assert sorted(tmp_path.rglob("*")) == before, "nothing may be written"
