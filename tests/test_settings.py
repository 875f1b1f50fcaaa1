"""The ridge penalty and analyze's options as single validated objects (synclib.penalty.Penalty,
synclib.analysis.AnalysisSettings): errors name the field, and one mapping from a run config
serves the main job and ``synclib analyze --config`` alike."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from synclib.penalty import DEFAULT_CV_ALPHAS, PAPER_ALPHA, Penalty
from synclib.splits import RidgeInputError


@pytest.mark.parametrize("kwargs, match", [
    (dict(kind="auto"), r"kind must be one of \('fixed', 'cv'\)"),
    (dict(alpha=0.0), r"alpha must be a positive number"),
    (dict(alpha=True), r"alpha must be a positive number"),
    (dict(alpha=[0.1, -1.0]), r"alpha must be a positive number"),
    (dict(kind="cv", alpha=0.1), r"alpha must be None with kind='cv'"),
    (dict(kind="cv", alpha=None, alphas=()), r"alphas \(the CV grid\) must be a non-empty list of numbers > 0"),
    (dict(kind="cv", alpha=None, alphas=(0.1, 0.0)), r"alphas \(the CV grid\)"),
    (dict(folds=1), r"folds \(the CV folds\) must be an integer >= 2, got 1"),
    (dict(columns=0), r"columns \(target columns per layer of the CV criterion\) must be null or an integer >= 1"),
    (dict(seed=-1), r"seed \(of the CV folds and columns\) must be an integer >= 0, got -1"),
])
def test_penalty_errors_name_the_field(kwargs, match):
    with pytest.raises(RidgeInputError, match=match):
        Penalty(**kwargs)


def test_penalty_parse_of_and_attrs_round_trip():
    with pytest.raises(RidgeInputError, match=r"alpha must be a number > 0 or 'cv', got 'auto'"):
        Penalty.parse("auto")
    with pytest.raises(RidgeInputError, match="alpha must be a number > 0 or 'cv', got -1"):
        Penalty.parse(-1)
    assert Penalty.parse(PAPER_ALPHA) == Penalty() and Penalty().is_paper() and not Penalty.parse("cv").is_paper()
    cv = Penalty.parse("cv", alphas=[1.0, 10.0], folds=4, columns=None, seed=2)
    assert (cv.kind, cv.alpha, cv.alphas, cv.folds, cv.columns, cv.seed) == ("cv", None, (1.0, 10.0), 4, None, 2)
    assert Penalty.of(cv) is cv and Penalty.of("cv") == Penalty.parse("cv")
    assert Penalty.of(np.array([0.1, 1.0])).alpha == (0.1, 1.0)
    for p in (cv, Penalty.parse("cv"), Penalty.parse(0.5)):
        assert Penalty.from_attrs(p.attrs()) == p
    assert Penalty.from_attrs({"alpha": "cv"}) == Penalty.parse("cv")  # an analysis written before the record
    assert Penalty.parse("cv").alphas == DEFAULT_CV_ALPHAS and Penalty.parse(0.5).label() == "λ = 0.5"


def test_the_config_and_the_command_line_check_the_penalty_through_penalty(tmp_path):
    from synclib import argtypes
    from synclib.config import ConfigError, load_config

    assert argtypes.ridge_alpha("cv") == "cv" and argtypes.ridge_alpha("0.3") == 0.3
    with pytest.raises(ValueError, match="> 0"):
        argtypes.ridge_alpha("0")
    with pytest.raises(ConfigError, match="analysis.cv_folds"):
        load_config(overrides=["analysis.cv_folds=1"])
    with pytest.raises(ConfigError, match="analysis.alpha"):
        load_config(overrides=["analysis.alpha=auto"])


def _cli_args(*argv):
    from synclib.cli import analyze as cli

    p = argparse.ArgumentParser()
    cli.configure_parser(p)
    return cli, p.parse_args(["cube.nc", "--out", "r.nc", *argv])


def test_the_pipeline_and_the_cli_share_one_mapping_from_the_config(monkeypatch, tmp_path):
    """``synclib analyze --config`` gives the settings the main job's step_analyze gives
    (AnalysisSettings.from_config), and an option on the command line overrides one value."""
    from synclib.run import pipeline
    from synclib.analysis import AnalysisSettings
    from synclib.config import load_config

    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text("results_dir: r\nscenarios: embedded\nmodels: {S: smollm2-135m}\npairs: [S-S]\n"
                        "judge: {model: x}\n"
                        "analysis:\n  alpha: cv\n  cv_folds: 4\n  cv_seed: 7\n  lags: [1]\n  nonlinear_seeds: 1\n")
    cfg = load_config(cfg_path)
    seen = {}
    monkeypatch.setattr(pipeline, "open_cube", lambda path: "cube")
    monkeypatch.setattr("synclib.analysis.analyze", lambda cube, settings: seen.setdefault("pipeline", settings))
    with pytest.raises(AttributeError):  # the fake result has no to_netcdf: the settings were taken
        pipeline.step_analyze(cfg, None, tmp_path / "out.nc", "cube.nc")
    expected = AnalysisSettings.from_config(cfg)
    assert seen["pipeline"] == expected
    assert expected.penalty == Penalty.parse("cv", folds=4, seed=7) and expected.lags == (1,)
    assert expected.nonlinear_seeds == 1

    cli, args = _cli_args("--config", str(cfg_path))
    assert cli.settings_from_args(args) == expected
    cli, args = _cli_args("--config", str(cfg_path), "--cv-folds", "5", "--no-persona-disjoint", "--lags", "1,2",
                          "--nonlinear-seeds", "0")
    assert cli.settings_from_args(args) == expected.replace(cv_folds=5, persona_disjoint=False, lags=(1, 2),
                                                            nonlinear_seeds=None)
    # without --config: the schema's defaults with the optional blocks off (the command line's own)
    cli, args = _cli_args()
    plain = cli.settings_from_args(args)
    assert plain.penalty == Penalty() and not (plain.persona_disjoint or plain.nonlinear or plain.tom)
    assert plain.surrogates == 0 and plain.lags == (1, 2)


def test_analysis_settings_errors_name_the_field():
    from synclib.analysis import AnalysisError, AnalysisSettings

    for kwargs, match in ((dict(split_seeds=()), "split_seeds"), (dict(n_boot=-1), "n_boot"),
                          (dict(directions=("A->C",)), "directions"), (dict(nonlinear_options={"hiden": 3}), "hiden"),
                          (dict(conditions=("passive",), nonlinear=True), "genuine"),
                          (dict(precision="fp8"), "precision"), (dict(penalty="auto"), "alpha")):
        with pytest.raises((AnalysisError, RidgeInputError, ValueError), match=match):
            AnalysisSettings(**kwargs)
    with pytest.raises(TypeError, match="unknown analysis option"):
        AnalysisSettings().replace(n_sample=3)
