"""A graph script's ``Config`` as flags (:mod:`daskrl.config_flags` through ``daskrl``'s
``main``): every field type reaches ``build()``, the script stands anywhere on the line, and a
bad or abbreviated flag is one error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GRAPH = str(REPO / "graphs" / "ppo.py")


TYPED_GRAPH = '''
"""A graph whose Config holds every kind of field; build() writes what it got and stops."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Literal, Optional

from daskrl import setting


@dataclass
class Adam:
    eps: float = 1e-5
    """added to the denominator"""


@dataclass
class Config:
    sizes: tuple[int, int] = (64, 64)
    """hidden units of the two layers"""
    critic: Literal["central", "local"] = "central"
    """central: global state; local: own observation"""
    max_episodes: Optional[int] = None
    """stop after this many episodes (default: no limit)"""
    teams: list[str] = field(default_factory=lambda: ["good"])
    """teams that learn"""
    clip_vloss: bool = True
    """clip the value loss"""
    learning_rate: float = setting("Adam learning rate", 2.5e-4)
    num_envs: int = setting("envs per actor replica", 8)
    adam: Adam = field(default_factory=Adam)


def build(config: Config):
    with open(os.environ["TYPED_GRAPH_OUT"], "w") as fh:
        json.dump(asdict(config), fh)
    raise ValueError("built")
'''

DEFAULTS = {"sizes": [64, 64], "critic": "central", "max_episodes": None, "teams": ["good"],
            "clip_vloss": True, "learning_rate": 2.5e-4, "num_envs": 8, "adam": {"eps": 1e-5}}


@pytest.fixture
def typed_graph(tmp_path, monkeypatch) -> Path:
    script = tmp_path / "typed.py"
    script.write_text(TYPED_GRAPH)
    monkeypatch.setenv("TYPED_GRAPH_OUT", str(tmp_path / "built.json"))
    return script


def built_config(argv: list[str], script: Path, capsys) -> dict:
    """The config ``daskrl train`` passed to the typed graph's build()."""
    from daskrl.cli import main

    (script.parent / "built.json").unlink(missing_ok=True)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == "daskrl: error: built", err  # build() raised, as meant
    return json.loads((script.parent / "built.json").read_text())


def test_every_field_type_is_a_flag_that_reaches_build(typed_graph, capsys):
    script = str(typed_graph)
    assert built_config(["train", script, "--scheduler", "sync"], typed_graph,
                        capsys) == DEFAULTS
    got = built_config(["train", script, "--scheduler", "sync", "--sizes", "32", "16",
                        "--critic", "local", "--max-episodes", "7", "--teams", "a", "b",
                        "--no-clip-vloss", "--learning-rate", "1e-3", "--num-envs", "4",
                        "--adam.eps", "1e-8"],
                       typed_graph, capsys)
    assert got == {"sizes": [32, 16], "critic": "local", "max_episodes": 7, "teams": ["a", "b"],
                   "clip_vloss": False, "learning_rate": 1e-3, "num_envs": 4,
                   "adam": {"eps": 1e-8}}
    got = built_config(["train", script, "--scheduler", "sync", "--max-episodes", "None",
                        "--clip-vloss", "--teams"], typed_graph, capsys)
    assert got == {**DEFAULTS, "teams": []}


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_the_graph_script_may_stand_anywhere(typed_graph, where):
    from daskrl.run_flags import parse_command_line

    flags = ["--steps", "1000", "--sizes", "3", "4", "--seed", "5", "--teams", "x", "y"]
    at = {"first": 0, "middle": 3, "last": len(flags)}[where]
    args, module, config = parse_command_line(
        ["train", *flags[:at], str(typed_graph), *flags[at:]])
    assert (args.graph, args.steps, args.seed) == (str(typed_graph), 1000, 5)
    assert (config.sizes, config.teams) == ((3, 4), ["x", "y"])
    assert type(config) is module.Config


BAD_FLAGS = {
    "tuple value": (["--sizes", "1", "x"], "--sizes: "),
    "tuple too short": (["--sizes", "1"], "'--sizes'. Expected 2 values"),
    "literal": (["--critic", "global"], "invalid choice 'global' for argument '--critic'"),
    "optional": (["--max-episodes", "some"], "--max-episodes: "),
    "float": (["--learning-rate", "fast"], "--learning-rate: "),
    "abbreviated graph flag": (["--learning", "1e-3"],
                               "unrecognized flag --learning; did you mean --learning-rate?"),
    "abbreviated run flag": (["--ste", "10"], "unrecognized flag --ste; did you mean --steps?"),
    "bad run flag value": (["--steps", "many"], "argument --steps: invalid int value: 'many'"),
    "unknown flag": (["--bogus"], "unrecognized flag --bogus"),
}


@pytest.mark.parametrize("name", BAD_FLAGS)
def test_a_bad_flag_is_one_line_naming_it(typed_graph, capsys, name):
    from daskrl.cli import main

    flags, message = BAD_FLAGS[name]
    code = main(["train", "--scheduler", "sync", *flags, str(typed_graph)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("daskrl: error: "), err
    assert message in err and "--help" in err, err  # what is wrong, and where to look
    assert not (typed_graph.parent / "built.json").exists()  # refused before build()


def test_help_lists_run_flags_and_graph_flags_with_their_docstrings(typed_graph, capsys):
    from daskrl.cli import main

    with pytest.raises(SystemExit) as info:
        main(["train", "--steps", "10", str(typed_graph), "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for run_flag in ("--distribution", "--steps", "--scheduler", "--resume", "--cluster"):
        assert run_flag in out, run_flag
    graph_part = out[out.index("graph settings"):]
    for flag, text in [("--sizes INT INT", "hidden units of the two layers"),
                       ("--critic {central,local}", "central: global state"),
                       ("--max-episodes {None}|INT", "stop after this many episodes"),
                       ("--teams", "teams that learn"),
                       ("--clip-vloss, --no-clip-vloss", "clip the value loss"),
                       ("--learning-rate FLOAT", "Adam learning rate"),  # setting()'s text
                       ("--num-envs INT", "envs per actor replica"),
                       ("--adam.eps FLOAT", "added to the denominator")]:
        assert flag in graph_part and text in graph_part, (flag, graph_part)


def test_a_config_field_named_like_a_run_flag_is_refused(tmp_path, capsys):
    from daskrl.cli import main

    script = tmp_path / "clash.py"
    script.write_text("from dataclasses import dataclass\n\n\n@dataclass\nclass Config:\n"
                      "    seed: int = 0\n\n\ndef build(config):\n    raise ValueError\n")
    assert main(["train", str(script), "--scheduler", "sync"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("daskrl: error: ") and "--seed" in err and len(err.splitlines()) == 1


def test_cluster_flags_reach_the_job_spec(typed_graph):
    from daskrl.cli import _batch_spec
    from daskrl.run_flags import parse_command_line

    args, _, _ = parse_command_line(["train", str(typed_graph), "--cluster", "slurm",
                                     "--queue", "debug", "--cores", "2",
                                     "--job-extra=--constraint=v100"])
    spec = _batch_spec(args)
    assert (spec.kind, spec.queue, spec.cores, spec.job_extra) == (
        "slurm", "debug", 2, ["--constraint=v100"])
    args, _, _ = parse_command_line(["train", str(typed_graph)])
    assert _batch_spec(args) is None


def test_the_early_cluster_finds_the_graph_anywhere():
    from daskrl.cli import _early_cluster
    from daskrl.run_flags import graph_path

    assert graph_path(["train", "--steps", "10", GRAPH, "--num-envs", "2"]) == GRAPH
    assert graph_path(["graph", "--out", "x.svg", GRAPH]) == GRAPH
    assert graph_path(["train", "--steps", "10"]) is None
    assert graph_path(["plot", "run.py"]) is None
    assert _early_cluster(["train", "--scheduler", "sync", GRAPH]) is None
    assert _early_cluster(["train", "--steps", "10", GRAPH, "--help"]) is None


def test_graph_command_passes_the_changed_fields_to_the_renderer(typed_graph, monkeypatch,
                                                                  capsys):
    import daskrl.observe.render
    from daskrl.cli import main

    calls = []
    monkeypatch.setattr(daskrl.observe.render, "render_iteration",
                        lambda *args: calls.append(args) or Path(args[2]))
    assert main(["graph", "--sizes", "3", "4", str(typed_graph), "--out", "g.svg",
                 "--critic", "central", "--distribution", "single"]) == 0, capsys.readouterr()
    assert calls == [(str(typed_graph), "single", Path("g.svg"), {"sizes": (3, 4)})]


def test_a_config_file_sets_fields_and_flags_override_it(typed_graph, capsys):
    config = typed_graph.parent / "run.yaml"
    config.write_text("sizes: [16, 8]\ncritic: local\nnum_envs: 2\nlearning_rate: 1\n"
                      "adam: {eps: 1.0e-7}\n")
    script = str(typed_graph)
    got = built_config(["train", script, "--scheduler", "sync", "--config", str(config),
                        "--num-envs", "6"], typed_graph, capsys)
    assert got == {**DEFAULTS, "sizes": [16, 8], "critic": "local", "num_envs": 6,
                   "learning_rate": 1.0, "adam": {"eps": 1e-7}}


CONFIG_ERRORS = {
    "num_env: 2\n": "unknown key 'num_env'; did you mean 'num_envs'?",
    "num_envs: many\n": "num_envs must be int, got 'many'",
    "num_envs: [1\n": "not valid YAML (line 2)",
    "- 1\n": "expected a mapping of setting names to values, got list",
}


@pytest.mark.parametrize("text", CONFIG_ERRORS)
def test_a_bad_config_file_is_one_line_naming_it(typed_graph, capsys, text):
    from daskrl.cli import main

    config = typed_graph.parent / "bad.yaml"
    config.write_text(text)
    code = main(["train", str(typed_graph), "--scheduler", "sync", "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"daskrl: error: --config {config}: {CONFIG_ERRORS[text]}"), err
    assert not (typed_graph.parent / "built.json").exists()
