"""The README and docs/*.md run as written: every ``bash`` and ``python`` block of a page is executed in order, in a
fresh directory and in the activated environment the pages tell users to use (``source .venv/bin/activate``), at a
tiny size set by the ``<!-- doc-test: ... -->`` comment before the block; blocks that cannot run here (downloads,
several nodes, hour-long studies) have their arguments parsed and the files they name checked instead. So a renamed
command, flag or function fails here before it fails a reader. docs/development.md documents the directives."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest
from doc_fixtures import prepare
from doc_runner import (
    PAGES,
    ROOT,
    Block,
    check_block,
    check_command,
    inline_commands,
    missing,
    page_blocks,
    runnable_bash,
    runnable_python,
    toml_loads,
)

VENV = Path(sys.prefix)
RUN_LANGUAGES = ("bash", "python")
CHECKED_LANGUAGES = ("toml", "text", "")


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


# ---------------------------------------------------------------------------------------------------------------
# fast checks of every page


def test_the_readme_is_a_front_page_that_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250, "the README is a front page: move the details into docs/"
    first = page_blocks(ROOT / "README.md")[0]
    commands = [line.split("#")[0].strip() for line in first.code.splitlines()]
    assert commands == [
        "bash scripts/setup.sh && .venv/bin/compressive-transformer demo",
        "bash scripts/setup.sh && .venv/bin/python -m pytest -q",
    ]
    assert text.index("```bash") == text.index("## Quick start") + text[text.index("## Quick start") :].index("```")


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_block_is_run_or_checked(page: Path) -> None:
    for block in page_blocks(page):
        assert block.lang in RUN_LANGUAGES + CHECKED_LANGUAGES, f"{block.where}: a {block.lang!r} block"
        if block.lang == "toml":
            toml_loads(block.code)
        if block.directives.parse:
            assert block.lang == "bash", f"{block.where}: only bash blocks are parsed"
            check_block(block)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_commands_in_the_prose_parse(page: Path) -> None:
    for line, span in inline_commands(page):
        check_command(shlex.split(span), f"{page_id(page)}:{line}")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {github_anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_links_and_anchors_exist(page: Path) -> None:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page_id(page)}: link to {target}, which does not exist"
        if anchor:
            assert anchor in anchors(file), f"{page_id(page)}: {target}: no heading with that anchor"


# ---------------------------------------------------------------------------------------------------------------
# the pages run


def environment(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CT_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(
        HOME=os.environ.get("HOME", str(tmp)),
        MPLBACKEND="Agg",
        HF_HUB_OFFLINE="1",  # nothing is downloaded: the harness reads local tasks
        HF_DATASETS_OFFLINE="1",
    )
    return env


def run_block(block: Block, tmp: Path) -> None:
    cwd = ROOT if block.directives.cwd_repo else tmp
    if block.lang == "bash":
        script = tmp / ".doc-block.sh"
        script.write_text(f"set -eo pipefail\nsource {VENV}/bin/activate\n" + runnable_bash(block, tmp))
        argv = ["bash", str(script)]
    else:
        script = tmp / ".doc-block.py"
        script.write_text(runnable_python(block, tmp))
        argv = [str(VENV / "bin" / "python"), str(script)]
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=environment(tmp), capture_output=True, text=True, timeout=block.directives.timeout
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{block.where}: still running after {block.directives.timeout} s") from e
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
        raise AssertionError(f"{block.where}: exit {done.returncode}\n{script.read_text()}\n--- output ---\n{tail}")


def run_page(page: Path, tmp: Path) -> tuple[str, str]:
    """Run a page's blocks in order in ``tmp``: ("ok", ""), ("skip", why) or ("fail", what went wrong)."""
    blocks = [b for b in page_blocks(page) if b.lang in RUN_LANGUAGES and not b.directives.parse]
    if not blocks:
        return "skip", "nothing to run: every block is checked by the fast tests"
    prepare(tmp, page.read_text(encoding="utf-8"))
    skipped = []
    for block in blocks:
        absent = missing(block.directives.needs)
        if absent:
            skipped.append(f"{block.where} needs {', '.join(absent)}")
            continue
        try:
            run_block(block, tmp)
        except AssertionError as e:
            return "fail", str(e)
    if skipped:
        return "skip", f"ran {len(blocks) - len(skipped)} of {len(blocks)} blocks; " + "; ".join(skipped)
    return "ok", ""


@pytest.fixture(scope="session")
def page_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The selected pages, run side by side (each is one process at a time, mostly on one core), those with the
    most commands first: their futures."""
    selected = {item.callspec.params["page"] for item in request.session.items if item.name.startswith(PAGE_TEST)}
    pages = sorted((p for p in PAGES if p in selected), key=lambda p: -p.read_text().count("compressive-transformer"))
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        yield {p: pool.submit(run_page, p, tmp_path_factory.mktemp(p.stem)) for p in pages}


PAGE_TEST = "test_the_page_runs_as_written"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_the_page_runs_as_written(page: Path, page_runs: dict) -> None:
    if not (VENV / "bin" / "activate").is_file():
        pytest.skip("the docs' commands run in the virtual environment scripts/setup.sh makes; run the tests with it")
    status, message = page_runs[page].result()
    if status == "skip":
        pytest.skip(message)
    assert status == "ok", message
