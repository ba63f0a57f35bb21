"""Pages made from the code at build time, and the rule every code block follows.

At ``builder-inited`` (before Sphinx reads the sources) this writes, each only when its text
changed:

- ``reference/graph-settings.md``: every ``graphs/*.py`` script's ``Config`` flags, as
  ``daskrl train GRAPH --help`` prints them (tyro, through :func:`daskrl.config_flags.graph_help`);
- ``reference/api.rst``: autodoc of every name in ``daskrl.__all__``, grouped by the module
  that defines it;
- ``benchmarks/<name>.md``: each ``benchmarks/*.md`` page as the benchmark scripts write it,
  its links pointed at the site and each command marked as not run in CI, and
  ``benchmarks/_commands.md``, the table of every page's commands.

Those files are ignored by git. Every code block of the site is then checked when its page is
read: it is shell or Python that CI runs (class ``ci-run``: ``tests/test_docs.py`` runs the
page's blocks; class ``ci-test``: a test named for the block's ``:name:`` runs it), or it
carries a caption ``Not run in CI: <why>`` that the reader sees, or it is output or a listing
(``text``). A block that is none of these is a warning, and the CI build (``-W``) fails.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import os
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
NOT_RUN = "Not run in CI:"
_NOT_RUN = re.compile(r"^Not run in CI\b[^:]*: \S.{8,}")
"""A caption that marks a block as not run: ``Not run in CI: <why>`` (or ``Not run in CI as
written: <why>``), the reason at least a few words."""
RUN_CLASSES = {"ci-run", "ci-test"}
OUTPUT_LANGUAGES = {"text", "none", "default"}
BENCHMARK_CAPTION = (f"{NOT_RUN} a benchmark run (minutes to hours on 2 cores); this page "
                     "gives its settings and the load it ran under")


def write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` unless it holds it already (Sphinx rebuilds what changed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


# --------------------------------------------------------------------------- graph settings


def graph_settings_page() -> str:
    """The flags of every graph script's ``Config``, one section per script."""
    from daskrl.config_flags import graph_help
    from daskrl.core.script import load_graph

    lines = [
        "# Graph settings",
        "",
        "The flags each graph script adds to `daskrl train` and `daskrl graph`, made from its",
        "`Config` dataclass by tyro (this page is written from the scripts when the docs are",
        "built: it is what `daskrl train GRAPH --help` prints after the run flags). The same",
        "names are keywords of `daskrl.train(GRAPH, ...)` with `_` for `-`, and keys of",
        "`--config FILE.yaml`.",
        "",
    ]
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "96"  # tyro wraps to the terminal: the same text on every machine
    try:
        for script in sorted((ROOT / "graphs").glob("*.py")):
            if script.name.startswith("_"):
                continue
            with contextlib.redirect_stderr(io.StringIO()):
                module = load_graph(str(script))
            rel = script.relative_to(ROOT).as_posix()
            doc = inspect.cleandoc(module.__doc__ or "").split("\n\n")[0]
            text = graph_help(module.Config, f"daskrl train {rel}")
            lines += [f"## `{rel}`", "", doc.replace("``", "`"), "", "```text", text, "```", ""]
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before
    return "\n".join(lines)


# --------------------------------------------------------------------------- API reference


def api_page() -> str:
    """autodoc of ``daskrl.__all__``, one section per defining module, in ``__all__``'s order
    of first appearance."""
    import daskrl

    groups: dict[str, list[str]] = {}
    for name in daskrl.__all__:
        module = getattr(getattr(daskrl, name), "__module__", "daskrl")
        groups.setdefault(module, []).append(name)
    order = sorted(groups, key=lambda m: (m != "daskrl.api", m))  # training from Python first
    lines = [
        "API reference",
        "=============",
        "",
        "Everything ``import daskrl`` offers (``daskrl.__all__``), from the docstrings, grouped",
        "by the module that defines it. Graph scripts also use the building blocks listed in",
        ":doc:`modules`.",
        "",
    ]
    for module in order:
        summary = inspect.cleandoc(importlib.import_module(module).__doc__ or "").split("\n\n")[0]
        title = f"``{module}``"
        lines += [title, "-" * len(title), "", summary, ""]
        for name in groups[module]:
            obj = getattr(daskrl, name)
            if inspect.isclass(obj):
                lines += [f".. autoclass:: daskrl.{name}", "   :members:", ""]
            else:
                lines += [f".. autofunction:: daskrl.{name}", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- benchmark pages

_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(\s*)```([A-Za-z0-9_+-]*)\s*$")
_HEADING = re.compile(r"^(#{1,6})(\s.*)$")


def benchmark_name(source: Path) -> str:
    """The page a ``benchmarks/*.md`` file becomes: its stem, ``overview`` for the README."""
    return "overview" if source.name == "README.md" else source.stem


def _link(match: re.Match, folder: Path) -> str:
    """A link of a benchmark page, pointed from ``docs/benchmarks/`` at the same thing: a
    page of the site, a download of a script or results file, or its text alone (a folder)."""
    text, target = match.groups()
    if re.match(r"^[a-z]+://|^#|^mailto:", target):
        return match.group(0)
    path, _, anchor = target.partition("#")
    resolved = (folder / path).resolve()
    anchor = f"#{anchor}" if anchor else ""
    if resolved.suffix == ".md" and resolved.parent == folder:
        return f"[{text}]({benchmark_name(resolved)}.md{anchor})"
    if resolved == ROOT / "README.md":
        return f"[{text}](../index.md)"
    if resolved.is_file() and resolved.is_relative_to(ROOT):
        return f"[{text}](../../{resolved.relative_to(ROOT).as_posix()})"
    return text


def benchmark_page(source: Path) -> str:
    """``source`` as a page of the site: links re-pointed, headings without level jumps (the
    scripts write sections of their own), every command captioned as not run in CI."""
    out: list[str] = []
    level = 0
    fenced = False
    for line in source.read_text().splitlines():
        fence = _FENCE.match(line)
        if fence:
            indent, language = fence.groups()
            if fenced:
                out.append(line)
            elif language and language not in OUTPUT_LANGUAGES:
                out += [f"{indent}```{{code-block}} {language}",
                        f"{indent}:caption: {BENCHMARK_CAPTION}"]
            else:
                out.append(f"{indent}```text")
            fenced = not fenced
            continue
        if not fenced:
            heading = _HEADING.match(line)
            if heading:
                level = min(len(heading.group(1)), level + 1)
                line = "#" * level + heading.group(2)
            line = _LINK.sub(lambda m: _link(m, source.parent), line)
        out.append(line)
    if source.name == "README.md" and out and out[0].startswith("# "):
        out[0] = "# The harness, and PPO on CartPole-v1"
    return "\n".join(out) + "\n"


_INLINE_COMMAND = re.compile(r"`((?:nice -n \d+ )?python benchmarks/[^`]+)`")
_FENCED_COMMAND = re.compile(r"^\s*((?:nice -n \d+ )?python benchmarks/.*)$")


def benchmark_commands(source: Path) -> list[str]:
    """The benchmark commands a ``benchmarks/*.md`` page gives, in its order, each once:
    lines of its shell blocks (continuations joined, comments dropped) and inline code."""
    found: list[str] = []
    fenced = False
    pending = ""
    for line in source.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            line = pending + line.strip()
            if line.endswith("\\"):
                pending = line[:-1].rstrip() + " "
                continue
            pending = ""
            match = _FENCED_COMMAND.match(line.split("  #")[0])
            commands = [match.group(1).strip()] if match else []
        else:
            commands = _INLINE_COMMAND.findall(line)
        found += [c for c in commands if c not in found]
    return found


def benchmark_index(sources: list[Path]) -> str:
    """Every benchmark page with the commands it gives, as a definition list
    (``benchmarks/_commands.md``, included by ``benchmarks/index.md``)."""
    lines: list[str] = []
    for source in sources:
        title = next((ln[2:].strip() for ln in source.read_text().splitlines()
                      if ln.startswith("# ")), source.stem)
        if source.name == "README.md":
            title = "The harness, and PPO on CartPole-v1"
        lines += [f"[{title}]({benchmark_name(source)}.md)"]
        lines += [f": `{c}`" for c in benchmark_commands(source)] or [": (see the page)"]
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the rule


def check_code_blocks(app: Sphinx, doctree: nodes.document) -> None:
    """Warn about each code block CI neither runs nor marks as not run with a reason."""
    for block in doctree.findall(nodes.literal_block):
        language = block.get("language", "default")
        if language in OUTPUT_LANGUAGES or RUN_CLASSES & set(block.get("classes", [])):
            continue
        if block.get("testnodetype"):  # sphinx.ext.doctest's blocks
            continue
        parent = block.parent
        captions = [c.astext() for c in parent.findall(nodes.caption)] if isinstance(
            parent, nodes.container) else []
        if any(_NOT_RUN.match(c) for c in captions):
            continue
        logger.warning(
            "a %s code block that CI neither runs nor marks as not run: give it "
            ":class: ci-run (tests/test_docs.py runs it), :class: ci-test with a :name: a "
            "test uses, or :caption: %s <why>", language, NOT_RUN,
            location=block, type="daskrl", subtype="code_block")


# --------------------------------------------------------------------------- setup


def generate(app: Sphinx) -> None:
    """Write the generated pages before Sphinx reads the sources."""
    write_if_changed(DOCS / "reference" / "graph-settings.md", graph_settings_page())
    write_if_changed(DOCS / "reference" / "api.rst", api_page())
    sources = sorted((ROOT / "benchmarks").glob("*.md"))
    for source in sources:
        write_if_changed(DOCS / "benchmarks" / f"{benchmark_name(source)}.md",
                         benchmark_page(source))
    write_if_changed(DOCS / "benchmarks" / "_commands.md", benchmark_index(sources))


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the page generation and the code-block rule."""
    app.connect("builder-inited", generate)
    app.connect("doctree-read", check_code_blocks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
