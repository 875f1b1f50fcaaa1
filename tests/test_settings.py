"""The settings as single validated objects: the ridge penalty and analyze's options (synclib.penalty.Penalty,
synclib.analysis.AnalysisSettings): errors name the field and the key, the keys give the rules and
defaults, and one mapping from a run config serves the main job and ``synclib analyze`` alike."""
from __future__ import annotations

import argparse
import re
from dataclasses import replace

import numpy as np
import pytest

from synclib.penalty import DEFAULT_CV_ALPHAS, PAPER_ALPHA, Penalty
from synclib.simulate import Batching, Passes, RunOptions, Sampling
from synclib.splits import RidgeInputError


@pytest.mark.parametrize("kwargs, match", [
    (dict(alpha="auto"), r"alpha must be a positive number, an array of them or 'cv'"),
    (dict(alpha=0.0), r"alpha must be a positive number"),
    (dict(alpha=True), r"alpha must be a positive number"),
    (dict(alpha=[0.1, -1.0]), r"alpha must be a positive number"),
    (dict(alpha="cv", cv_alphas=()), r"cv_alphas \(the CV grid\) must be a non-empty list of numbers > 0"),
    (dict(alpha="cv", cv_alphas=(0.1, 0.0)), r"cv_alphas \(the CV grid\)"),
    (dict(cv_folds=1), r"cv_folds \(the CV folds\) must be an integer >= 2, got 1"),
    (dict(cv_columns=0), r"cv_columns \(target columns per layer of the CV criterion\) must be null or an integer >= 1"),
    (dict(cv_seed=-1), r"cv_seed \(of the CV folds and columns\) must be an integer >= 0, got -1"),
])
def test_penalty_errors_name_the_field(kwargs, match):
    with pytest.raises(RidgeInputError, match=match):
        Penalty(**kwargs)


def test_penalty_of_and_attrs_round_trip_under_the_configs_names():
    from synclib.keys import KEYS
    from synclib.penalty import FIELDS

    assert Penalty(PAPER_ALPHA) == Penalty() and Penalty().is_paper() and not Penalty("cv").is_paper()
    cv = Penalty("cv", cv_alphas=[1.0, 10.0], cv_folds=4, cv_columns=None, cv_seed=2)
    assert (cv.kind, cv.alpha, cv.cv_alphas, cv.cv_folds, cv.cv_columns, cv.cv_seed) == ("cv", "cv", (1.0, 10.0), 4,
                                                                                         None, 2)
    assert Penalty.of(cv) is cv and Penalty.of("cv") == Penalty("cv") and Penalty(0.5).kind == "fixed"
    assert Penalty.of(np.array([0.1, 1.0])).alpha == (0.1, 1.0)
    for p in (cv, Penalty("cv"), Penalty(0.5)):
        assert Penalty.from_attrs(p.attrs()) == p
    # one spelling: each field is a config key and, with CV, an attribute of the analysis
    assert {f"analysis.{f}" for f in FIELDS} <= {k.path for k in KEYS} and set(FIELDS) <= set(cv.attrs())
    assert Penalty.from_attrs({"alpha": "cv"}) == Penalty("cv")  # an analysis written before the record
    old = {"alpha": "cv", "penalty_kind": "cv", "alpha_grid": np.array([1.0, 10.0]), "penalty_folds": 4,
           "penalty_columns": -1, "penalty_seed": 2}  # an analysis written before the one spelling
    assert Penalty.from_attrs(old) == cv
    assert Penalty("cv").cv_alphas == DEFAULT_CV_ALPHAS and Penalty(0.5).label() == "λ = 0.5"


def test_the_config_and_the_command_line_check_the_penalty_through_penalty(tmp_path):
    from synclib.cli import argtypes
    from synclib.config import ConfigError, load_config

    alpha, grid = argtypes.setting("analysis.alpha"), argtypes.setting("analysis.cv_alphas")
    assert alpha("cv") == "cv" and alpha("0.3") == 0.3 and grid("0.1,1,10") == [0.1, 1.0, 10.0] and grid("2") == [2]
    for parse, bad, match in ((alpha, "0", "a number > 0 or 'cv', got 0"),
                              (grid, "0.1,-1", r"a non-empty list of numbers > 0, got \[0.1, -1\]")):
        with pytest.raises(argparse.ArgumentTypeError, match=match):
            parse(bad)
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
    assert expected.penalty == Penalty("cv", cv_folds=4, cv_seed=7) and expected.lags == (1,)
    assert expected.nonlinear_seeds == 1

    cli, args = _cli_args("--config", str(cfg_path))
    assert cli.settings_from_args(args) == expected
    cli, args = _cli_args("--config", str(cfg_path), "--cv-folds", "5", "--no-persona-disjoint", "--lags", "1,2",
                          "--nonlinear-seeds", "0")
    assert cli.settings_from_args(args) == expected.replace(cv_folds=5, persona_disjoint=False, lags=(1, 2),
                                                            nonlinear_seeds=None)
    cli, args = _cli_args("--config", str(cfg_path), "--alpha", "0.5", "--cv-alphas", "1,10", "--no-pseudo-dyads",
                          "--nonlinear-epochs", "7", "--max-resident-gib", "0.5", "--device", "cpu")
    got = cli.settings_from_args(args)
    assert got.penalty == Penalty(0.5, cv_alphas=(1.0, 10.0), cv_folds=4, cv_seed=7) and "pseudo" not in got.conditions
    assert got.nonlinear_options.epochs == 7 and got.max_resident_bytes == 2**29 and got.device == "cpu"
    # 0 stands for a key's null ("all", "full batch"), checked by the key: 1 sample is refused
    cli, args = _cli_args("--config", str(cfg_path), "--n-samples", "0", "--cv-columns", "0",
                          "--nonlinear-batch-size", "0")
    got = cli.settings_from_args(args)
    assert got.n_samples is None and got.penalty.cv_columns is None and got.nonlinear_options.batch_size is None
    cli, args = _cli_args("--config", str(cfg_path), "--n-samples", "none", "--cv-columns", "8")
    got = cli.settings_from_args(args)
    assert got.n_samples is None and got.penalty.cv_columns == 8
    # the lists by their keys too: empty text is none of them, a lag of 0 or a size of 1 is refused
    cli, args = _cli_args("--lags", "", "--sample-sizes", "")
    got = cli.settings_from_args(args)
    assert got.lags == () and got.sample_sizes is None and "lag1" not in got.all_conditions()
    assert cli.settings_from_args(_cli_args("--sample-sizes", "100,200")[1]).sample_sizes == (100, 200)
    for option, bad in (("--lags", "0,1"), ("--sample-sizes", "1,200")):
        with pytest.raises(SystemExit):
            _cli_args(option, bad)
    cli, args = _cli_args("--planted", "3", "--no-tom-format-filter")
    assert cli.settings_from_args(args).planted == 3
    assert cli.settings_from_args(args).tom_options == {"format_filter": False}


def test_synclib_analyze_without_a_config_has_a_run_configs_defaults(tmp_path):
    """Without --config, ``synclib analyze`` computes what a run config that sets no analysis
    key computes (the keys' defaults: 99 surrogates, every block on), not a second set."""
    from synclib.analysis import AnalysisError, AnalysisSettings
    from synclib.config import default, load_config

    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text("results_dir: r\nscenarios: embedded\nmodels: {S: smollm2-135m}\npairs: [S-S]\n"
                        "judge: {model: x}\n")
    cli, args = _cli_args()
    plain = cli.settings_from_args(args)
    assert plain == AnalysisSettings.from_config(load_config(cfg_path))
    assert plain.surrogates == default("analysis.surrogates") == 99 and plain.planted == default("analysis.planted")
    assert plain.persona_disjoint and plain.relationship and plain.nonlinear and plain.tom
    assert plain.penalty == Penalty() and plain.lags == (1, 2) and plain.n_samples == 6500
    # conditions without genuine: the blocks that need it are off, unless one is asked for
    alone = cli.settings_from_args(_cli_args("--conditions", "passive,lag1")[1])
    assert alone.conditions == ("passive", "lag1") and alone.lags is None and not alone.needs_genuine()
    assert alone.tom and alone.n_boot == plain.n_boot
    with pytest.raises(AnalysisError, match="need the 'genuine' condition"):
        cli.settings_from_args(_cli_args("--conditions", "passive", "--surrogates", "5")[1])


def test_synclib_analyze_skips_the_tom_decoding_of_a_cube_without_tom_dialogs(monkeypatch, tmp_path, capsys):
    from synclib.analysis import core

    seen = []

    class Cube:
        variables = {"hidden_a": None}

    class Result:
        condition = type("C", (), {"values": []})()

        def to_netcdf(self, path):
            path.write_text("")

    cli, args = _cli_args()
    monkeypatch.setattr(cli, "open_cube", lambda path: Cube())
    monkeypatch.setattr(core, "analyze", lambda cube, settings, progress: seen.append(settings) or Result())
    args.out = str(tmp_path / "r.nc")
    assert cli.run(args) == 0 and not seen[0].tom and "no ToM decoding" in capsys.readouterr().err
    _, args = _cli_args("--tom")
    args.out = str(tmp_path / "r.nc")
    assert cli.run(args) == 0 and seen[1].tom  # asked for: the analysis says what is missing


def test_every_analysis_key_is_an_option_of_synclib_analyze():
    """Each analysis.* key is an option of ``synclib analyze`` of its name, with the key's
    help, not given unless typed (so --config's value stands); the other options are few."""
    from synclib.cli import analyze as cli
    from synclib.keys import KEYS

    p = argparse.ArgumentParser()
    cli.configure_parser(p)
    options = {a.dest: a for a in p._actions}
    keys = [k for k in KEYS if k.path.startswith("analysis.")]
    for key in keys:
        name = key.path.split(".", 1)[1]
        assert name in options, f"{key.path} has no option in synclib analyze"
        assert options[name].default is None and key.help in options[name].help, key.path
        assert "--" + name.replace("_", "-") in options[name].option_strings
    others = set(options) - {k.path.split(".", 1)[1] for k in keys}
    assert others == {"help", "cube", "out", "config", "conditions", "device", "no_progress"}


def test_every_analysis_key_reaches_the_settings():
    """AnalysisSettings.from_config reads every analysis.* key: a config that changes one key
    makes other settings (the keyed fields through the key table, the rest derived)."""
    from synclib.analysis import AnalysisSettings
    from synclib.keys import KEYS, section_defaults

    other = {"alpha": "cv", "cv_alphas": [1.0], "cv_folds": 5, "cv_columns": None, "cv_seed": 3, "n_samples": None,
             "split_seeds": [4], "lags": [3], "pseudo_dyads": False, "surrogates": 9, "planted": 2,
             "sample_sizes": [100], "persona_disjoint": False, "relationship": False, "nonlinear": False,
             "nonlinear_epochs": 3, "nonlinear_batch_size": None, "nonlinear_seeds": 1, "n_boot": 0, "tom": False,
             "tom_format_filter": False, "precision": "bf16", "max_resident_gib": 0}
    assert set(other) == {k.path.split(".", 1)[1] for k in KEYS if k.path.startswith("analysis.")}
    base = {**section_defaults("analysis"), **section_defaults("simulate")}
    plain = AnalysisSettings.from_config(base)
    for name, value in other.items():
        changed = AnalysisSettings.from_config({**base, "analysis": {**base["analysis"], name: value}})
        assert changed != plain, name


def test_the_analysis_settings_defaults_are_the_keys():
    """A keyed field's default is its key's, but for the optional blocks, which a bare library
    call leaves off; the MLP's keyed fields too."""
    from dataclasses import fields

    from synclib.analysis import AnalysisSettings
    from synclib.analysis.mlp import MLPOptions
    from synclib.keys import default

    blocks = {"persona_disjoint", "relationship", "nonlinear", "tom", "surrogates", "planted"}
    for cls in (AnalysisSettings, MLPOptions):
        for f in fields(cls):
            if f.name in cls.KEYS and f.name not in blocks | set(cls.UNSET):
                want = default(cls.KEYS[f.name])
                assert f.default == (tuple(want) if isinstance(want, list) else want), (cls.__name__, f.name)
    assert not any(getattr(AnalysisSettings(), b) for b in blocks) and all(default(f"analysis.{b}") for b in blocks)
    assert AnalysisSettings().penalty == Penalty()


def test_a_split_seed_numpy_cannot_take_is_refused_with_the_config():
    """analysis.split_seeds: numpy's RandomState takes seeds up to 2**32 - 1; the config refuses
    a larger one before any work (it failed only in the analysis, after the simulations)."""
    from synclib.analysis import AnalysisError, AnalysisSettings
    from synclib.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"analysis.split_seeds = \[0, 4294967296\] is not allowed: must be a "
                                          r"non-empty list of distinct integers >= 0 and <= 4294967295"):
        load_config(None, ["analysis.split_seeds=[0, 4294967296]"])
    with pytest.raises(AnalysisError, match=r"AnalysisSettings.split_seeds must be .* got \[4294967296\] "
                                            r"\(config key analysis.split_seeds\)"):
        AnalysisSettings(split_seeds=(2**32,))
    assert AnalysisSettings(split_seeds=np.arange(3)).split_seeds == (0, 1, 2)


@pytest.mark.parametrize("make, match", [
    (dict(surrogates=-1), r"AnalysisSettings.surrogates must be an integer >= 0, got -1 "
                          r"\(config key analysis.surrogates\)"),
    (dict(tom="yes"), r"AnalysisSettings.tom must be true or false, got 'yes' \(config key analysis.tom\)"),
    (dict(n_samples=1), r"AnalysisSettings.n_samples must be null or an integer >= 2, got 1 \(config key "
                        r"analysis.n_samples\)"),
    (dict(sample_sizes=(1,)), r"AnalysisSettings.sample_sizes must be null or .* \(config key analysis.sample_sizes\)"),
    (dict(relationship_min=-1), r"AnalysisSettings.relationship_min must be an integer >= 0, got -1$"),
    (dict(relationship_seeds=()), r"AnalysisSettings.relationship_seeds must be a non-empty list"),
    (dict(max_resident_bytes=-1), r"AnalysisSettings.max_resident_bytes must be null or an integer >= 0, got -1$"),
])
def test_analysis_settings_errors_name_the_field_and_the_key(make, match):
    """A keyed field's error names the field and its key; a field that is no key, the field."""
    from synclib.analysis import AnalysisError, AnalysisSettings

    with pytest.raises(AnalysisError, match=match):
        AnalysisSettings(**make)


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


def test_the_lags_and_the_mlps_training_are_checked_by_their_keys():
    """analysis.lags and analysis.nonlinear_* have one rule each, the key's: the library's
    objects used to check them again (lags with lag 0 allowed, then refused as a condition)."""
    from synclib.analysis import AnalysisError, AnalysisSettings
    from synclib.analysis.mlp import MLPOptions

    with pytest.raises(AnalysisError, match=r"AnalysisSettings.lags must be a list of distinct integers >= 1, "
                                            r"got \[0, 1\] \(config key analysis.lags\)"):
        AnalysisSettings(lags=(0, 1))
    assert AnalysisSettings(lags=None).lags is None and AnalysisSettings(lags=[2]).lags == (2,)
    assert AnalysisSettings(lags=()).all_conditions() == ["genuine", "passive", "passive_own", "shuffled", "pseudo"]
    with pytest.raises(ValueError, match=r"MLPOptions.epochs must be an integer >= 1, got 0 "
                                         r"\(config key analysis.nonlinear_epochs\)"):
        MLPOptions(epochs=0)
    with pytest.raises(ValueError, match=r"MLPOptions.batch_size must be null or an integer >= 1, got 0 "
                                         r"\(config key analysis.nonlinear_batch_size\)"):
        MLPOptions(batch_size=0)
    for kwargs, match in ((dict(hidden=0), "MLPOptions.hidden must be an integer >= 1, got 0"),
                          (dict(lr=0.0), "MLPOptions.lr must be a number > 0, got 0.0"),
                          (dict(weight_decay=-1), "MLPOptions.weight_decay must be a number >= 0, got -1")):
        with pytest.raises(ValueError, match=re.escape(match)):
            MLPOptions(**kwargs)
    assert MLPOptions(batch_size=None).batch_size is None
    cfg = {"analysis": {"nonlinear_epochs": 7, "nonlinear_batch_size": None}}
    assert MLPOptions.from_config(cfg) == MLPOptions(epochs=7, batch_size=None)


def test_simulate_and_run_share_one_mapping_from_the_config(monkeypatch, tmp_path):
    """``synclib simulate --config`` hands simulate() the option groups the main job's
    simulate_call hands it (each group's from_config); an option overrides its key only."""
    from synclib.cli import simulate as cli
    from synclib.config import load_config
    from synclib.run import pipeline

    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text("results_dir: r\nscenarios: embedded\nmodels: {S: smollm2-135m}\npairs: [S-S]\n"
                        "judge: {model: x}\nsimulate:\n  episodes: 3\n  seeds: [0, 2]\n  max_new_tokens: 12\n"
                        "  reply_end: sentence\n  top_k: 20\n  passive_seeds: [2]\n  tom_episodes: 1\n"
                        "  units_per_part: 4\n  cache_gib: 0.5\n  store_dtype: float16\n")
    cfg = load_config(cfg_path)
    _, expected = pipeline.simulate_call(cfg, pipeline.runs(cfg)[0])

    def run_cli(*argv):
        seen = {}
        monkeypatch.setattr(cli, "simulate", lambda *a, **k: seen.update(k, seeds=a[3], tasks=a[2]) or "x.nc")
        p = argparse.ArgumentParser()
        cli.configure_parser(p)
        assert cli.run(p.parse_args(["--model-a", "m", "--out", str(tmp_path / "x.nc"), "--no-progress", *argv])) == 0
        return seen

    seen = run_cli("--config", str(cfg_path))
    for group in ("sampling", "passes", "batching"):
        assert seen[group] == expected[group], group
    assert seen["options"].store_dtype == "float16" and seen["seeds"] == [0, 2]
    assert [t.index for t in seen["tasks"]] == [t.index for t in expected["tasks"]] == [0, 1, 2]
    assert seen["max_utterances"] == expected["max_utterances"]

    seen = run_cli("--config", str(cfg_path), "--max-new-tokens", "30", "--no-tom", "--reply-end", "line")
    assert seen["sampling"] == replace(expected["sampling"], max_new_tokens=30, reply_end="line")
    assert seen["passes"] == replace(expected["passes"], tom=False) and seen["batching"] == expected["batching"]

    # without --config: the schema's defaults, the passive reader and the ToM dialogs off unless asked
    seen = run_cli()
    assert seen["sampling"] == Sampling() and seen["batching"] == Batching()
    assert not (seen["passes"].passive or seen["passes"].tom)


def test_every_simulate_key_is_an_option_of_synclib_simulate():
    """Each simulate.* key of the run config is an option of ``synclib simulate`` of the same
    name (episodes: --episodes), whose help names the key."""
    from synclib.cli import simulate as cli
    from synclib.keys import KEYS

    p = argparse.ArgumentParser()
    cli.configure_parser(p)
    options = {a.dest: a for a in p._actions}
    for key in (k for k in KEYS if k.path.startswith("simulate.")):
        name = key.path.split(".", 1)[1]
        assert name in options, f"{key.path} has no option in synclib simulate"
        assert name == "episodes" or key.path in options[name].help, key.path


@pytest.mark.parametrize("make, match", [
    (lambda: Sampling(temperature=-1),
     r"Sampling.temperature must be a number >= 0, got -1 \(config key simulate.temperature\)"),
    (lambda: Sampling(top_p=1.5), r"Sampling.top_p must be 'model', a number in \(0, 1\] or null, got 1.5"),
    (lambda: Sampling(stop_at_first_line="yes"), r"Sampling.stop_at_first_line must be true or false"),
    (lambda: Passes(passive_seeds=(0, 0)), r"Passes.passive_seeds must be null or a non-empty list of distinct"),
    (lambda: Passes(tom_episodes=0), r"Passes.tom_episodes must be null or an integer >= 1, got 0"),
    (lambda: Batching(kv_tokens=0), r"Batching.kv_tokens must be null or an integer >= 1, got 0"),
    (lambda: Batching(cache_gib="lots"), r"Batching.cache_gib must be 'auto' or a number >= 0, got 'lots'"),
    (lambda: RunOptions(store_dtype="int8"), r"RunOptions.store_dtype must be one of 'float32', 'float16', 'bfloat16'"),
])
def test_simulate_option_errors_name_the_field_and_the_key(make, match):
    """The option groups check each field by its config key's one rule (synclib.keys)."""
    with pytest.raises(ValueError, match=match):
        make()


def test_simulate_option_groups_are_config_keys_with_the_schemas_defaults():
    """Every field a group checks is a config key, and its default is that key's (the passive
    reader and the ToM dialogs: off in a bare library call, on in the run config)."""
    from dataclasses import fields

    from synclib.keys import KEYS, default

    paths = {k.path for k in KEYS}
    for group in (Sampling, Passes, Batching, RunOptions):
        assert set(group.KEYS.values()) <= paths, group
        for f in fields(group):
            if f.name in group.KEYS and f.name not in ("passive", "tom"):
                assert f.default == default(group.KEYS[f.name]), (group.__name__, f.name)
    assert Passes().passive is False and default("simulate.passive") is True
    assert Passes(passive_seeds=(1, 0)).passive_seeds == (1, 0)  # the library's tuples, kept in order
