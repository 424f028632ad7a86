"""Every shell command that README.md and docs/*.md show runs as written and prints what they show.

The conventions a writer of those files follows:

* Commands live in fenced ``console`` blocks. A line starting with ``$ `` is a command (a
  trailing backslash continues it on the next line); the lines after it, up to the next
  ``$ `` line or the end of the block, are its output as shown.
* Each block runs in a fresh temporary directory that holds a symlink ``testdata`` to the
  repository's testdata/, with the directory of this Python (the virtual environment's bin/,
  where ``make install`` put ``baechi``) first on PATH. The commands run one after another,
  each with ``bash -c`` in that directory: a command may read what an earlier command of the
  same block wrote, and nothing is written into the checkout.
* A command must exit 0, unless the next command is ``echo $?``: then it must exit with the
  code shown under that line.
* Every line of shown output must appear in the command's output (stdout and stderr
  together), in the order shown and adjacent to each other; a line ``...`` marks lines left
  out. Runs of whitespace compare equal to one space (tables are padded, and off a terminal
  the CLI wraps lines longer than 160 columns), and wall-clock timings are not compared: a
  number followed by `` s`` (``placed in 0.43 s``) and the ``place (s)`` column of
  ``baechi compare``'s table. A command shown without output is checked for its exit code only.
* HTML comments on the lines right before a block change how it runs:
  ``<!-- test: slow -->`` marks it ``slow`` (run by ``make test-slow``, not ``make test``);
  ``<!-- test: needs MODULE -->`` skips it when MODULE (e.g. ``torch``) cannot be imported;
  ``<!-- file: NAME -->`` before a block of another language (a YAML device spec, say) writes
  that block's text to NAME in the directory of every console block of the same file.
* ``sh``, ``bash`` and ``shell`` blocks may hold only ``make`` commands: the set-up lines
  ``make install`` and ``make test`` are not run here, since CI runs them itself (.ci/run).
  Any other command belongs in a ``console`` block, and a ``$ `` line in a block of any other
  language is an error, so that no command escapes this test.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGUAGES = {"sh", "bash", "shell", "zsh"}
COMMAND_TIMEOUT_S = 600

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
_DIRECTIVE = re.compile(r"^\s*<!--\s*(test|file):\s*(.*?)\s*-->\s*$")
_SECONDS = re.compile(r"\b\d+(?:\.\d+)? s\b")
_TABLE_RULE = re.compile(r"^[-+\s]+$")


@dataclass
class Block:
    """A fenced block of a document: its language, text and the directives written before it."""

    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    directives: list[tuple[str, str]] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


@dataclass
class Command:
    line: int
    text: str
    shown: list[str] = field(default_factory=list)


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path``, each with the ``<!-- test: ... -->`` and ``<!-- file: ... -->``
    comments on the lines right before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    pending: list[tuple[str, str]] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        directive = _DIRECTIVE.match(lines[i])
        if fence:
            marker = fence.group(1)
            end = i + 1
            while end < len(lines) and not lines[end].strip().startswith(marker):
                end += 1
            body = "\n".join(lines[i + 1 : end])
            found.append(Block(path, i + 1, fence.group(2).lower(), body, pending))
            pending = []
            i = end + 1
            continue
        if directive:
            pending.append((directive.group(1), directive.group(2)))
        elif lines[i].strip():
            pending = []
        i += 1
    return found


def commands(block: Block) -> list[Command]:
    """The ``$ `` commands of a console block, each with the output shown under it."""
    found: list[Command] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            start = i
            text = line[2:]
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text += "\n" + lines[i]
            found.append(Command(block.line + 1 + start, text))
        elif found:
            found[-1].shown.append(line)
        elif line.strip():
            raise AssertionError(f"{block.where}: output before the block's first '$ ' command: {line!r}")
        i += 1
    return found


def _mask_place_column(lines: list[str]) -> list[str]:
    """Blank ``baechi compare``'s ``place (s)`` cells: wall-clock seconds."""
    out: list[str] = []
    column: int | None = None
    for line in lines:
        cells = line.split("|")
        names = [cell.strip() for cell in cells]
        if "place (s)" in names:
            column = names.index("place (s)")
        elif column is not None and len(cells) > column:
            cells[column] = " - "
        elif column is not None and not _TABLE_RULE.match(line) and line.strip() != "...":
            column = None
        out.append("|".join(cells))
    return out


def normalized(lines: list[str]) -> str:
    """``lines`` as one string, whitespace runs as one space, timings in seconds masked."""
    return _SECONDS.sub("N s", " ".join(" ".join(lines).split()))


def check_shown(command: Command, output: str, where: str) -> None:
    """Each run of shown lines between ``...`` markers appears in ``output``, in order."""
    chunks: list[list[str]] = [[]]
    for line in _mask_place_column(command.shown):
        if line.strip() == "...":
            chunks.append([])
        else:
            chunks[-1].append(line)
    text = normalized(_mask_place_column(output.splitlines()))
    position = 0
    for chunk in chunks:
        want = normalized(chunk)
        if not want:
            continue
        found = text.find(want, position)
        if found < 0:
            missing = next((line for line in chunk if normalized([line]) not in text), chunk[0])
            pytest.fail(
                f"{where}: `{command.text}` did not print what the document shows.\n"
                f"first line not found (in order): {missing!r}\n--- shown ---\n"
                + "\n".join(chunk)
                + f"\n--- printed ---\n{output[-8000:]}"
            )
        position = found + len(want)


def files_of(path: Path) -> dict[str, str]:
    """The blocks of ``path`` marked ``<!-- file: NAME -->``, by NAME."""
    files: dict[str, str] = {}
    for block in blocks(path):
        for kind, value in block.directives:
            if kind == "file":
                files[value] = block.text + "\n"
    return files


def _console_cases() -> list:
    cases = []
    for path in DOCUMENTS:
        for block in blocks(path):
            if block.language != "console":
                continue
            marks = []
            for kind, value in block.directives:
                if kind != "test":
                    continue
                words = value.split()
                if words == ["slow"]:
                    marks.append(pytest.mark.slow)
                elif len(words) == 2 and words[0] == "needs":
                    missing = importlib.util.find_spec(words[1]) is None
                    marks.append(pytest.mark.skipif(missing, reason=f"needs {words[1]}"))
                else:
                    raise AssertionError(f"{block.where}: unknown directive 'test: {value}'")
            cases.append(pytest.param(block, id=block.where, marks=marks))
    return cases


def _environment() -> dict[str, str]:
    bindir = os.path.dirname(sys.executable)
    if not os.path.exists(os.path.join(bindir, "baechi")):
        pytest.fail(f"no baechi beside {sys.executable}: run `make install` (or pip install -e .) first")
    env = {key: value for key, value in os.environ.items() if key != "BAECHI_DEBUG"}
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"  # stdout and stderr interleave as printed
    env["NO_COLOR"] = "1"
    env.pop("COLUMNS", None)
    return env


@pytest.mark.parametrize("block", _console_cases())
def test_console_block(block: Block, tmp_path: Path) -> None:
    """The block's commands exit as shown (0 unless an ``echo $?`` follows) and print what is shown."""
    (tmp_path / "testdata").symlink_to(ROOT / "testdata", target_is_directory=True)
    for name, text in files_of(block.path).items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    env = _environment()
    steps = commands(block)
    assert steps, f"{block.where}: a console block without a '$ ' command"
    last_code: int | None = None
    for k, command in enumerate(steps):
        where = f"{block.path.relative_to(ROOT)}:{command.line}"
        if command.text.strip() == "echo $?":
            assert last_code is not None, f"{where}: 'echo $?' before any command"
            shown = [line.strip() for line in command.shown if line.strip()]
            assert shown == [str(last_code)], f"{where}: the command before exited {last_code}, shown {shown}"
            continue
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command.text],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=COMMAND_TIMEOUT_S,
        )
        output = done.stdout.decode("utf-8", errors="replace")
        followed_by_code = k + 1 < len(steps) and steps[k + 1].text.strip() == "echo $?"
        if not followed_by_code:
            assert done.returncode == 0, (
                f"{where}: `{command.text}` exited {done.returncode}:\n{output[-8000:]}"
            )
        check_shown(command, output, where)
        last_code = done.returncode


def test_every_command_is_in_a_console_block() -> None:
    """Shell blocks hold only ``make`` lines, and no other block hides a ``$ `` command."""
    problems = []
    for path in DOCUMENTS:
        for block in blocks(path):
            lines = [line.strip() for line in block.text.splitlines()]
            if block.language in SHELL_LANGUAGES:
                for line in lines:
                    command = line.split("#", 1)[0].strip()
                    if command and not command.startswith("make "):
                        problems.append(f"{block.where}: {line!r} (use a console block: '$ {command}')")
            elif block.language != "console":
                problems += [
                    f"{block.where}: {line!r} outside a console block"
                    for line in lines
                    if line.startswith("$ ")
                ]
            for kind, value in block.directives:
                if kind == "file" and (not value or "/" in value or value.startswith(".")):
                    problems.append(f"{block.where}: 'file: {value}' must be a plain file name")
    assert not problems, "\n".join(problems)


def test_the_readme_runs_commands() -> None:
    """The README shows its examples as console blocks (so that the test above runs them)."""
    readme = [block for block in blocks(ROOT / "README.md") if block.language == "console"]
    assert sum(len(commands(block)) for block in readme) >= 5
