"""synclib.config: one schema; mistakes refused before any work, naming file or override, key and value."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from synclib import config, keys
from synclib.config import ConfigError, default, invalidation_table, keys_of_step, load_config

REPO = Path(__file__).resolve().parent.parent
GOOD = "results_dir: r\nscenarios: embedded\nmodels: {S: smollm2-135m}\npairs: [S-S]\njudge: {model: x}\n"


def _load(tmp_path, text, overrides=()):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return load_config(path, overrides)


def test_every_key_has_a_valid_default():
    for key in config.KEYS:
        if not key.required and key.path not in ("models", "pairs"):
            assert key.check(key.default) is not keys._BAD, key.path
        assert key.step in config.STEPS + (None,), key.path
    assert default("analysis.alpha") == 0.1 and default("simulate.max_new_tokens") == 300
    with pytest.raises(KeyError):
        default("results_dir")


@pytest.mark.parametrize("text, overrides, needles", [
    (GOOD + "simulate: {episods: 3}\n", (), ["run.yaml", "unknown key 'simulate.episods'",
                                              "did you mean 'simulate.episodes'"]),
    (GOOD, ["simulate.episods=3"], ["--set simulate.episods=3", "did you mean 'simulate.episodes'"]),
    (GOOD, ["simulate.temperature=-1"], ["--set simulate.temperature=-1", "simulate.temperature = -1",
                                         "a number >= 0"]),
    (GOOD, ["simulate.episodes=ten"], ["simulate.episodes = 'ten'", "positive integer"]),
    (GOOD, ["simulate.episodes=500"], ["simulate.episodes", "embedded has 64 tasks"]),
    (GOOD, ["analysis.split_seeds=[0, 0]"], ["analysis.split_seeds", "distinct"]),
    (GOOD + "judge: {model: x, url: localhost:8000/v1}\n", (), ["judge.url", "http(s) URL"]),
    (GOOD, ["scenarios=/no/such/folder"], ["scenarios = '/no/such/folder' does not exist"]),
    (GOOD, ["notebooks.ability_scores=/no/such.csv"], ["notebooks.ability_scores", "cannot be read"]),
    (GOOD, ["pairs=[S-Q]"], ["pairs entry 'S-Q'"]),
    (GOOD + "modles: {}\n", (), ["unknown key 'modles'", "did you mean 'models'"]),
    (GOOD.replace("{S: smollm2-135m}", "{S: {spec: a, lable: b}}"), (),
     ["unknown key 'models.S.lable'", "did you mean 'models.S.label'"]),
    (GOOD, ["simulate=3"], ["'simulate' is a section"]),
    (GOOD + "simulate: 3\n", (), ["'simulate' must be a section"]),
    (GOOD, ["judge.mode=constrained", "judge.url=http://h:1/v1"], ["judge.mode = 'constrained' needs a local"]),
    (GOOD, ["judge.timeout=0"], ["judge.timeout = 0", "a number > 0"]),
    (GOOD, ["judge.max_retries=-1"], ["judge.max_retries = -1", "an integer >= 0"]),
    (GOOD, ["judge.seed=1.5"], ["judge.seed = 1.5", "an integer >= 0"]),
    (GOOD, ["judge.max_tokens=0"], ["judge.max_tokens = 0", "null or an integer >= 1"]),
    (GOOD + "judge: {model: x, batch_size: many}\n", (), ["run.yaml", "judge.batch_size = 'many'", "an integer >= 1"]),
])
def test_mistakes_are_named(tmp_path, text, overrides, needles):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text, overrides)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_ability_scores_columns_checked(tmp_path):
    csv = tmp_path / "scores.csv"
    csv.write_text("model,ifeval\nx,1\n")
    with pytest.raises(ConfigError, match=r"lacks column\(s\) \['musr'\]"):
        _load(tmp_path, GOOD, [f"notebooks.ability_scores={csv}"])
    csv.write_text("Model,IFEval,MuSR\nx,1,2\n")
    assert _load(tmp_path, GOOD, [f"notebooks.ability_scores={csv}"])["notebooks"]["ability_scores"] == str(csv)


def test_defaults_filled_and_mode_follows_url(tmp_path):
    cfg = _load(tmp_path, GOOD)
    assert cfg["simulate"]["max_utterances"] == 16 and cfg["judge"]["mode"] == "constrained"
    assert cfg["models"]["S"] == {"spec": "smollm2-135m", "family": "S", "label": "smollm2-135m",
                                  "prompt_format": "chat_template"}
    assert _load(tmp_path, GOOD, ["judge.url=http://127.0.0.1:8000/v1"])["judge"]["mode"] == "json"


def test_steps_partition_the_keys():
    assert "judge.concurrency" not in keys_of_step("judge") and "judge.sample" in keys_of_step("judge")
    # the judge's seed and answer length change its scores; its timeout, retries and batch only how it runs
    assert {"judge.seed", "judge.max_tokens"} <= set(keys_of_step("judge"))
    assert not {"judge.timeout", "judge.max_retries", "judge.batch_size"} & {k for s in config.STEPS
                                                                           for k in keys_of_step(s)}
    assert "analysis.max_resident_gib" not in keys_of_step("analyze")
    table = invalidation_table()
    assert "| `simulate.temperature` | simulate |" in table and "`judge.concurrency` | nothing" in table


def test_run_refuses_a_typo_before_any_work(tmp_path):
    out = tmp_path / "results"
    res = subprocess.run([sys.executable, "-m", "synclib.cli", "run", "--set", "simulate.episods=3",
                          "--set", f"results_dir={out}"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 2
    assert "did you mean 'simulate.episodes'" in res.stderr and "Traceback" not in res.stderr
    assert not out.exists()


def test_judge_defaults_agree_with_the_judge_package():
    """The config schema is the home of defaults; the judge package reads its constants from it."""
    from synclib.config import default
    from synclib.judge import rubric
    from synclib.judge.items import LAYOUTS

    from synclib.judge.options import MODES
    from synclib.keys import JUDGE_LAYOUTS, JUDGE_MODES, KEYS

    assert default("judge.reasoning_max_chars") == rubric.REASONING_MAX_CHARS
    assert default("judge.layout") in LAYOUTS
    # the judge's vocabularies are the keys' choices, one tuple each (the keys sit below the judge)
    assert LAYOUTS is JUDGE_LAYOUTS and MODES is JUDGE_MODES
    allowed = {k.path: k.check.allowed for k in KEYS}
    assert allowed["judge.layout"] == "one of " + ", ".join(map(repr, LAYOUTS))
    assert allowed["judge.mode"] == "null or one of " + ", ".join(map(repr, MODES))


def test_analysis_defaults_agree_with_the_analysis_package():
    """The resample count lives in the analysis package (which loads torch); the schema's
    default, written out to keep the config light, matches it.  The penalty's defaults are
    read from synclib.penalty by both."""
    from synclib.analysis import AnalysisSettings
    from synclib.analysis.blocks import N_BOOT
    from synclib.config import default
    from synclib.penalty import PAPER_ALPHA, Penalty

    settings = AnalysisSettings()
    assert default("analysis.alpha") == PAPER_ALPHA == settings.penalty.alpha
    assert default("analysis.n_boot") == N_BOOT == settings.n_boot
    cv = Penalty("cv")
    assert (tuple(default("analysis.cv_alphas")), default("analysis.cv_folds"), default("analysis.cv_columns"),
            default("analysis.cv_seed")) == (cv.cv_alphas, cv.cv_folds, cv.cv_columns, cv.cv_seed)


def test_environment_yml_lists_pyproject_dependencies():
    """environment.yml (the GPU route) installs exactly pyproject.toml's packages (the
    dependencies and the embedded, book, test and cluster extras) with the same version
    bounds, from conda-forge only (the `pytorch` channel stopped publishing after 2.5), with
    the CUDA build of torch."""
    import yaml
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in ("embedded", "book", "test", "cluster"):
        wanted += project["optional-dependencies"][extra]

    def table(specs):
        out = {}
        for spec in specs:
            r = Requirement(spec)
            name = canonicalize_name(r.name)
            out[name] = str(r.specifier)
        return out

    env = yaml.safe_load((REPO / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "cuda-version>=12.4" in conda and any(d.startswith("pytorch-gpu") for d in conda)
    listed = [d for d in conda if not d.startswith(("python=", "pip", "cuda-version"))]
    listed = [d.replace("pytorch-gpu", "torch", 1) for d in listed] + [d for d in pip if d != "-e ."]
    assert table(listed) == table(wanted)


def test_documented_hub_commands_exist_in_the_installed_hub():
    """The hub log-in the pages and configs tell a user to run is a command of the installed
    huggingface_hub (``huggingface-cli`` is gone from it: the command is ``hf auth login``)."""
    import re
    import subprocess
    import sys

    texts = "\n".join(p.read_text() for p in [REPO / "README.md", *(REPO / "book").glob("*.md"),
                                               *(REPO / "config").glob("*.yaml")])
    assert "huggingface-cli" not in texts
    commands = set(re.findall(r"`(hf [a-z][a-z ]*[a-z])`", texts))
    assert "hf auth login" in commands
    for cmd in commands:
        proc = subprocess.run([str(Path(sys.executable).with_name("hf")), *cmd.split()[1:], "--help"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (cmd, proc.stderr[-1000:])
