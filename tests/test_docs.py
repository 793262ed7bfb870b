"""The README and docs/ stay true: every relative link resolves (to a file, and to a heading where it
names one), and every shell block names only Makefile targets, modules and files that exist."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\s*$")
SHELL = {"bash", "sh", "shell", "console"}


def unfenced(text: str) -> list[str]:
    """The page's lines outside its fenced blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def prose(text: str) -> str:
    """The page without its code: a link inside a code block or a code span is code, not a link."""
    return "\n".join(re.sub(r"`[^`]*`", "", line) for line in unfenced(text))


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text()))


def slug(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's) gives a heading."""
    text = re.sub(r"[`*_]{2,}|`", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in unfenced(page.read_text()) if re.match(r"#+\s", line)}


def shell_blocks(page: Path) -> list[list[str]]:
    """The lines of each fenced shell block of the page."""
    blocks, current, inside = [], None, False
    for line in page.read_text().splitlines():
        m = FENCE.match(line.strip())
        if not inside and m:
            inside, current = True, ([] if m.group(1) in SHELL else None)
        elif inside and line.strip() == "```":
            if current is not None:
                blocks.append(current)
            inside = False
        elif inside and current is not None:
            current.append(line)
    return blocks


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def module_exists(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    if path.with_suffix(".py").is_file() or (path / "__main__.py").is_file():
        return True
    return name.split(".")[0] not in {p.name for p in ROOT.iterdir()} and importlib.util.find_spec(name) is not None


def named(command: str) -> list[tuple[str, str]]:
    """(kind, name) of what one shell line names: make targets, ``-m`` modules, project files."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:  # an unbalanced quote inside a comment or a prompt: read the words plainly
        words = command.split("#", 1)[0].split()
    got = []
    if words[:1] == ["make"]:
        got += [("target", w) for w in words[1:] if not w.startswith("-") and "=" not in w][:1]
    for i, w in enumerate(words[:-1]):
        if w == "-m" and re.fullmatch(r"[\w.]+", words[i + 1]):
            got.append(("module", words[i + 1]))
    for w in words:
        if re.fullmatch(r"(spark_jobs|benchmarks|experiments|examples|docs|include|dags|lookup)/[\w./-]+\.\w+", w):
            got.append(("file", w))
    return got


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: another site's to keep
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor}")
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_names_a_real_target_module_or_file(page):
    targets, wrong = make_targets(), []
    for block in shell_blocks(page):
        for line in block:
            for kind, name in named(line):
                ok = (name in targets if kind == "target" else module_exists(name) if kind == "module"
                      else (ROOT / name).exists())
                if not ok:
                    wrong.append(f"{kind} {name!r} in: {line.strip()}")
    assert wrong == []


def test_every_shell_block_of_the_readme_runs_something_of_this_project():
    """The front page's commands are the project's own: each block names a target or a module."""
    blocks = shell_blocks(ROOT / "README.md")
    assert len(blocks) >= 4
    assert [b for b in blocks if not any(named(line) for line in b)] == []


def test_the_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert "make demo" in text and "make test" in text
    reached, todo = set(), [ROOT / "README.md"]
    while todo:  # every docs page is reachable from it, directly or page by page
        page = todo.pop()
        for target in links(page):
            dest = (page.parent / target.partition("#")[0]).resolve()
            if dest.suffix == ".md" and dest.is_file() and dest not in reached and not re.match(r"[a-z]+:", target):
                reached.add(dest)
                todo.append(dest)
    assert {p.resolve() for p in (ROOT / "docs").rglob("*.md")} - reached == set()
