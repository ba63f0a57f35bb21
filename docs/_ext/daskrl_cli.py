"""The parser sphinx-argparse draws the CLI reference from: ``daskrl``'s own."""

from __future__ import annotations

import argparse
import re

_MARKUP = re.compile(r"([\\*`|])")


def plain(text: str | None) -> str | None:
    """argparse help is plain text, and sphinx-argparse reads it as reStructuredText: escape
    what rST would take for markup (``DIR/*.mp4`` is not emphasis, ``a_`` not a link)."""
    if not text:
        return text
    return re.sub(r"(\w)_(?=\W|$)", r"\1\\_", _MARKUP.sub(r"\\\1", text))


def _escape(parser: argparse.ArgumentParser) -> None:
    parser.description = plain(parser.description)
    parser.epilog = plain(parser.epilog)
    for action in parser._actions:  # argparse keeps its actions here, and only here
        if action.help is not argparse.SUPPRESS:
            action.help = plain(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                choice.help = plain(choice.help)
            for sub in action.choices.values():
                _escape(sub)


def daskrl_parser() -> argparse.ArgumentParser:
    """``daskrl``'s run-flag parser, as ``daskrl --help`` and each subcommand use it."""
    from daskrl.run_flags import run_parser

    parser = run_parser()[0]
    _escape(parser)
    return parser
