"""A graph script's ``Config`` dataclass as command-line flags, through :func:`tyro.cli`.

Every type a field may hold (bool as ``--x/--no-x``, tuples, lists, ``Literal``,
``Optional``, nested dataclasses) is a flag, with the field's docstring (or
:func:`daskrl.setting` text) as its help; flags are never abbreviated, and a bad value is one
:class:`~daskrl.core.script.UserError` line naming the flag.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import os
import re
import sys
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

from daskrl.core.script import UserError

T = TypeVar("T")


def flag_class(config_cls: type) -> type:
    """The dataclass whose flags :func:`tyro.cli` builds for ``config_cls``.

    tyro reads help text from field docstrings; fields written with :func:`daskrl.setting`
    keep theirs in ``metadata["help"]``, so a subclass re-declares just those fields with the
    text as ``tyro.conf.arg(help=...)``. Docstrings of the other fields are still found
    through the subclass's bases. Without such fields, ``config_cls`` itself.

    Examples
    --------
    >>> from daskrl import setting
    >>> @dataclasses.dataclass
    ... class Config:
    ...     num_envs: int = setting("envs per replica", 8)
    >>> flag_class(Config) is Config, issubclass(flag_class(Config), Config)
    (False, True)
    """
    import tyro

    hints = typing.get_type_hints(config_cls, include_extras=True)
    redeclared = []
    for f in dataclasses.fields(config_cls):
        text = f.metadata.get("help")
        if not f.init or not text:
            continue
        default: dict[str, Any] = (
            {"default": f.default} if f.default is not dataclasses.MISSING else
            {"default_factory": f.default_factory}
            if f.default_factory is not dataclasses.MISSING else {})
        redeclared.append((f.name, typing.Annotated[hints[f.name], tyro.conf.arg(help=text)],
                           dataclasses.field(metadata=f.metadata, **default)))
    if not redeclared:
        return config_cls
    try:
        return dataclasses.make_dataclass(config_cls.__name__, redeclared, bases=(config_cls,))
    except TypeError:  # a frozen Config has only frozen subclasses
        return dataclasses.make_dataclass(config_cls.__name__, redeclared, bases=(config_cls,),
                                          frozen=True)


def flags_of(config_cls: type) -> set[str]:
    """The flags tyro gives ``config_cls``'s fields: ``--field-name``, and ``--no-field-name``
    for a ``bool``."""
    hints = typing.get_type_hints(config_cls)
    flags = set()
    for f in dataclasses.fields(config_cls):
        if f.init:
            name = f.name.replace("_", "-")
            flags |= {f"--{name}", f"--no-{name}"} if hints.get(f.name) is bool else {
                f"--{name}"}
    return flags


ELSEWHERE = {
    "--vtrace": "V-trace corrects an actor-critic's state-value targets for the policy lag, "
                "and this graph offers none (DQN and SAC have no state-value head): use "
                "graphs/ppo.py --vtrace, or graphs/impala.py",
}
"""Flags of some graphs that others lack, and why (said instead of a near spelling)."""


def check_flags(words: Sequence[str], config_cls: type, run_flags: Sequence[str],
                 prog: str) -> None:
    """Refuse a ``--flag`` that is neither a run flag nor a field of the graph's Config, with
    the closest real flag (abbreviations end here: argparse passed them on unmatched)."""
    known = flags_of(config_cls)
    for word in words:
        flag = word.split("=", 1)[0]
        name = flag.replace("_", "-")
        if not flag.startswith("--") or flag == "--" or name in known or (
                name.split(".", 1)[0] in known):  # a nested dataclass's --field.x
            continue
        close = difflib.get_close_matches(flag, sorted(known | set(run_flags)), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        if name in ELSEWHERE:
            hint = f": {ELSEWHERE[name]}"
        raise UserError(f"unrecognized flag {flag}{hint} (see `{prog} --help`)")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_BOX = "│┃|"
_RULE = set("─━-═╭╮╰╯┌┐└┘+ ")


def _one_line(text: str, prog: str) -> str:
    """tyro's boxed error as one line: the problem, then the flag's expected form and help.

    Examples
    --------
    >>> box = '''╭─ Value error ───────────────────────────────╮
    ... │ Error parsing --num-envs: invalid literal   │
    ... │ for int() with base 10: 'x'                 │
    ... │ ─────────────────────────────────────────── │
    ... │ Argument helptext:                          │
    ... │     --num-envs INT                          │
    ... │     envs per actor replica (default: 8)     │
    ... ╰─────────────────────────────────────────────╯'''
    >>> print(_one_line(box, "daskrl train g.py"))  # doctest: +NORMALIZE_WHITESPACE
    --num-envs: invalid literal for int() with base 10: 'x'; expected --num-envs INT
    (see `daskrl train g.py --help`)
    """
    lines = [raw.strip() for raw in _ANSI.sub("", text).splitlines() if raw.strip()]
    boxed = bool(lines) and lines[0][0] in "╭┌"  # else plain: a title line, then a rule
    sections: list[list[str]] = [[]]
    for raw in _ANSI.sub("", text).splitlines():
        line = raw.strip().strip(_BOX).strip()
        if line and (line[0] in "╭┌╰└" or set(line) <= _RULE):  # a border or rule
            sections.append([])
        else:
            sections[-1].append(line)
    sections = [s for s in sections if any(s)][0 if boxed else 1:]
    message: list[str] = []
    for line in (sections[0] if sections else []):
        if not line and message:
            break  # the first paragraph says what is wrong; details follow
        message.append(line)
    what = re.sub(r"\s+", " ", " ".join(message)).strip().removeprefix("Error parsing ")
    for section in sections[1:]:
        words = [ln for ln in section if ln]
        if len(words) >= 2 and words[0] == "Argument helptext:":
            what = f"{what.rstrip('.')}; expected {words[1]}"
        elif len(words) >= 2 and words[0] == "Perhaps you meant:":
            what = f"{what.rstrip('.')}; did you mean {words[1]}?"
    return f"{what or 'bad graph flags'} (see `{prog} --help`)"


@contextlib.contextmanager
def _wide_terminal() -> Any:
    """tyro wraps its messages to the terminal's width; unwrapped, they join into one line."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "1000"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before


def parse_config(config_cls: type[T], args: Sequence[str], prog: str = "daskrl",
                 default: T | None = None) -> T:
    """A ``config_cls`` with graph flags ``args`` (e.g. ``["--num-envs", "4"]``) applied.

    Parameters
    ----------
    config_cls
        A graph script's ``Config`` dataclass.
    args
        Its flags: ``--field-name VALUE`` (several values for tuples and lists),
        ``--flag/--no-flag`` for booleans.
    prog
        The command named in error messages, e.g. ``daskrl train graphs/ppo.py``.
    default
        The values of the fields ``args`` does not set (``--config FILE.yaml``'s); None: the
        Config's own defaults.

    Raises
    ------
    UserError
        One line naming the bad flag and what it expects.

    Examples
    --------
    >>> @dataclasses.dataclass
    ... class Config:
    ...     hidden: tuple[int, int] = (64, 64)
    ...     critic: typing.Literal["central", "local"] = "central"
    ...     teams: list[str] | None = None
    ...     anneal_lr: bool = True
    >>> parse_config(Config, ["--hidden", "32", "16", "--critic", "local", "--teams", "a", "b",
    ...                       "--no-anneal-lr"])
    Config(hidden=(32, 16), critic='local', teams=['a', 'b'], anneal_lr=False)
    >>> try:
    ...     parse_config(Config, ["--critic", "global"], "daskrl train g.py")
    ... except UserError as exc:
    ...     print(exc)  # doctest: +NORMALIZE_WHITESPACE
    invalid choice 'global' for argument '--critic'. Expected one of ('central', 'local').
    (see `daskrl train g.py --help`)
    """
    import tyro

    errors = io.StringIO()
    try:
        with _wide_terminal(), contextlib.redirect_stderr(errors):
            cls = flag_class(config_cls)
            start = None if default is None else cls(**{
                f.name: getattr(default, f.name) for f in dataclasses.fields(config_cls)
                if f.init})
            parsed = tyro.cli(cls, args=list(args), prog=prog, default=start)
    except SystemExit as exc:
        if not exc.code:
            raise
        raise UserError(_one_line(errors.getvalue(), prog)) from None
    except (TypeError, ValueError, NameError) as exc:  # e.g. the Config's own checks
        raise UserError(f"{prog}: {exc}") from None
    sys.stderr.write(errors.getvalue())  # warnings of a parse that succeeded
    if type(parsed) is config_cls:
        return parsed
    try:
        return config_cls(**{f.name: getattr(parsed, f.name)
                             for f in dataclasses.fields(config_cls) if f.init})
    except (TypeError, ValueError) as exc:
        raise UserError(f"{prog}: {exc}") from None


def graph_help(config_cls: type, prog: str) -> str:
    """The help of ``config_cls``'s flags as tyro writes it, without its usage line.

    Examples
    --------
    >>> @dataclasses.dataclass
    ... class Config:
    ...     num_envs: int = 8
    >>> "--num-envs INT" in graph_help(Config, "daskrl train g.py")
    True
    """
    import tyro

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            tyro.cli(flag_class(config_cls), args=["--help"], prog=prog)
        except SystemExit:
            pass
    # tyro writes plain text to a non-terminal: a usage line, then groups as a title over a
    # rule; the run's usage and -h come from argparse, and the caller names the group
    lines = [ln.rstrip() for ln in out.getvalue().splitlines()
             if not ln.lstrip().startswith(("usage:", "-h, --help"))
             and ln.strip() not in ("options", "") and not set(ln.strip()) <= set("-─")]
    return "\n".join(lines)
