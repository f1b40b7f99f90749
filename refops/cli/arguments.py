"""Checks of the commands' arguments, made while argparse parses them: before any work.

A command that trains, or runs every tier of the conformance, and only then finds that it cannot write
its output has lost that work, so each output path is probed first: its folder exists (or can be made)
and accepts a new file, and a file that will be replaced can be written. Each check is an argparse
``type=`` function, so a bad argument is argparse's error and exit status 2; :func:`refuse` is the same
for what only the combination of arguments decides. :class:`Parser` prints that error as one line, without
the usage block argparse puts first (it is longer than the error for ``conformance``).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
from typing import Callable, NoReturn

__all__ = ["Parser", "at_least", "output_file", "output_folder", "refuse"]


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``refops trace: error: ... (see refops trace --help)``.

    Subcommands' parsers are made by ``add_subparsers`` with the class of their parent, so they are one too.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def at_least(low: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: an integer ``>= low``; ``why`` says what a smaller one would make the command do."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}{f': {why}' if why else ''}")
        return value

    return parse


def output_file(text: str) -> pathlib.Path:
    """An argparse type: a file this process can write (its folder exists; an existing file is writable)."""
    path = pathlib.Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give the path of a file")
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"cannot write {text}: its folder {folder} {what}")
    if path.exists():
        _probe(path, text)
    else:
        _probe_folder(folder, text)
    return path


def output_folder(*names: str) -> Callable[[str], pathlib.Path]:
    """An argparse type: a folder that exists or can be made, into which the files ``names`` can be written."""

    def parse(text: str) -> pathlib.Path:
        path = pathlib.Path(text)
        if path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
        existing = next(p for p in (path, *path.parents) if p.exists())  # "." exists: the loop ends
        if not existing.is_dir():
            raise argparse.ArgumentTypeError(f"cannot make the folder {text}: {existing} is a file")
        _probe_folder(existing, text)
        for name in names:
            target = path / name
            if target.is_dir():
                raise argparse.ArgumentTypeError(f"cannot write {target}: it is a folder")
            if target.exists():
                _probe(target, str(target))
        return path

    return parse


def refuse(command: str, message: str) -> NoReturn:
    """Exit with status 2 and argparse's error line, for a combination of arguments the command cannot honour."""
    print(f"refops {command}: error: {message} (see refops {command} --help)", file=sys.stderr)
    raise SystemExit(2)


def _probe(path: pathlib.Path, text: str) -> None:
    """Opening for append writes nothing, and fails as the real write would (permissions, a read-only disk)."""
    try:
        with open(path, "a"):
            pass
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot write {text}: {error.strerror or error}") from None


def _probe_folder(folder: pathlib.Path, text: str) -> None:
    """A temporary file, deleted at once: unlike ``os.access``, it fails for root too (a read-only disk)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot write into {folder} (for {text}): {error.strerror or error}") \
            from None
