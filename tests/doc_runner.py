"""Reading the README and docs/*.md as tests: their fenced blocks, the ``<!-- doc-test: ... -->`` directives that
shrink a block to a test's size (docs/development.md, "Docs that run", documents them), and each command's
arguments for the blocks that are checked rather than run."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```[ \t]*$", re.M | re.S)
MARKER = re.compile(r"<!--\s*doc-test:(.*)-->", re.S)
PROGRAM = "compressive-transformer"
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class Directives:
    """What a ``<!-- doc-test: ... -->`` comment before a block asks for."""

    appends: dict[str, str] = field(default_factory=dict)  # subcommand -> arguments added to each of its lines
    replaces: list[tuple[str, str]] = field(default_factory=list)
    parse: bool = False  # check each command's arguments instead of running the block
    needs: list[str] = field(default_factory=list)  # extras of pyproject.toml or programs on the PATH
    cwd_repo: bool = False
    timeout: int = 900  # generous: a block that hangs fails, a block on a busy machine does not


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    directives: Directives

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse_directives(text: str, where: str) -> Directives:
    d = Directives()
    for item in (part.strip() for part in text.split(";")):
        if not item:
            continue
        if item == "parse":
            d.parse = True
        elif item == "cwd repo":
            d.cwd_repo = True
        elif item.startswith("needs "):
            d.needs += item.split()[1:]
        elif item.startswith("timeout:"):
            d.timeout = int(item.split(":", 1)[1])
        elif item.startswith("append ") and ":" in item:
            command, args = item[len("append ") :].split(":", 1)
            d.appends[command.strip()] = args.strip()
        elif item.startswith("replace:") and "=>" in item:
            old, new = item[len("replace:") :].split("=>", 1)
            d.replaces.append((old.strip(), new.strip()))
        else:
            raise ValueError(f"{where}: unknown doc-test directive {item!r}")
    return d


def page_blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` with the directives of the comment right before it."""
    text = page.read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip()
        comment = before[before.rfind("<!--") :] if before.endswith("-->") else ""  # the line right before the fence
        marker = MARKER.fullmatch(comment)
        where = f"{page.relative_to(ROOT)}:{line}"
        directives = parse_directives(marker.group(1), where) if marker else Directives()
        blocks.append(Block(page, line, match.group(1), match.group(2), directives))
    return blocks


try:
    from tomllib import loads as toml_loads
except ModuleNotFoundError:  # Python 3.10
    from tomli import loads as toml_loads


def extras() -> dict[str, list[str]]:
    """The optional extras of pyproject.toml and the distributions each one installs."""
    table = toml_loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {name: [re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0] for req in reqs] for name, reqs in table.items()}


def missing(needs: list[str]) -> list[str]:
    """The names of ``needs`` that are not installed here (an extra's distributions, or a program)."""
    known = extras()
    out = []
    for name in needs:
        if name in known:
            for dist in known[name]:
                try:
                    importlib.metadata.version(dist)
                except importlib.metadata.PackageNotFoundError:
                    out.append(f"{name} ({dist})")
                    break
        elif shutil.which(name) is None:
            out.append(name)
    return out


# ---------------------------------------------------------------------------------------------------------------
# bash blocks: logical lines, heredocs, comments


def logical_lines(code: str) -> list[tuple[str, bool]]:
    """The block's lines with continuations joined, each flagged True where it is a command (not heredoc text)."""
    lines: list[tuple[str, bool]] = []
    delimiter = None
    pending = ""
    for raw in code.splitlines():
        if delimiter is not None:
            lines.append((raw, False))
            delimiter = None if raw.strip() == delimiter else delimiter
            continue
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = pending + raw
        pending = ""
        lines.append((line, True))
        heredoc = re.search(r"<<-?\s*'?\"?(\w+)", line)
        delimiter = heredoc.group(1) if heredoc else None
    return lines


def split_comment(line: str) -> tuple[str, str]:
    """``line`` cut before a shell comment (a ``#`` after whitespace, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i:]
    return line.rstrip(), ""


def subcommand(words: list[str]) -> tuple[int, str] | None:
    """Where this library's command line starts in ``words`` (the index of its first argument) and its subcommand."""
    for i, word in enumerate(words):
        if Path(word).name == PROGRAM or (word == "compressive_transformer.cli" and i and words[i - 1] == "-m"):
            return (i + 1, words[i + 1]) if i + 1 < len(words) else (i + 1, "")
    return None


def runnable_bash(block: Block, tmp: Path) -> str:
    """The block's code with its replacements and appended arguments applied."""
    code = block.code.replace("{tmp}", str(tmp))
    for old, new in block.directives.replaces:
        if old not in code:
            raise AssertionError(f"{block.where}: replace: {old!r} is not in the block")
        code = code.replace(old, new.replace("{tmp}", str(tmp)))
    out = []
    for line, command in logical_lines(code):
        if command:
            body, comment = split_comment(line)
            found = subcommand(body.split())
            resumes = "--resume" in body.split()  # continues a run as it was started: left as written
            if found is not None and found[1] in block.directives.appends and not resumes:
                body = f"{body} {block.directives.appends[found[1]].replace('{tmp}', str(tmp))}"
            line = f"{body} {comment}".rstrip()
        out.append(line)
    return "\n".join(out) + "\n"


def runnable_python(block: Block, tmp: Path) -> str:
    code = block.code
    for old, new in block.directives.replaces:
        if old not in code:
            raise AssertionError(f"{block.where}: replace: {old!r} is not in the block")
        code = code.replace(old, new)
    return code.replace("{tmp}", str(tmp))


# ---------------------------------------------------------------------------------------------------------------
# blocks checked, not run


def check_command(words: list[str], where: str) -> None:
    """Raise AssertionError unless ``words`` (one command, environment assignments dropped) is one this test can
    check and its arguments parse: this library's command line, ``python -m MODULE``, ``bash scripts/setup.sh``."""
    from compressive_transformer import cli

    while words and ENV_ASSIGNMENT.match(words[0]):
        words = words[1:]
    found = subcommand(words)
    if found is not None:
        args = words[found[0] :]
        try:
            cli.build_parser().parse_args(args)
        except SystemExit as e:
            raise AssertionError(f"{where}: `{shlex.join(words)}` does not parse") from e
        for arg in args:
            if arg.endswith(".toml") and not arg.startswith("/") and "PATH/TO" not in arg:
                assert (ROOT / arg).is_file(), f"{where}: {arg} does not exist"
    elif words[:2] == ["bash", "scripts/setup.sh"]:
        unknown = [e for e in words[2:] if e not in extras() and e != "all"]
        assert not unknown, f"{where}: setup.sh has no extra {unknown}"
    elif len(words) >= 3 and Path(words[0]).name.startswith("python") and words[1] == "-m":
        sys.path.insert(0, str(ROOT))
        try:
            assert importlib.util.find_spec(words[2]) is not None, f"{where}: no module {words[2]}"
        finally:
            sys.path.remove(str(ROOT))
    else:
        raise AssertionError(f"{where}: `{shlex.join(words)}` is not a command a parse block can check")


def check_block(block: Block) -> None:
    for line, command in logical_lines(block.code):
        body, _ = split_comment(line)
        if command and body.strip():
            check_command(shlex.split(body), block.where)


def inline_commands(page: Path) -> list[tuple[int, str]]:
    """Inline code spans of the prose that are a command of this library with concrete arguments."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), page.read_text(encoding="utf-8"))
    found = []
    for match in re.finditer(r"`((?:\.venv/bin/)?compressive-transformer [^`]+)`", text):
        span = match.group(1)
        if not re.search(r"\.\.\.|\||\[|<|\bCOMMAND\b", span):
            found.append((text.count("\n", 0, match.start()) + 1, span))
    return found
