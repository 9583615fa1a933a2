"""A submitted entrypoint's script and working directory are checked before the job is
stored: a missing script is a 422 at submission naming the field and the path checked,
not a failed job minutes later on a worker.

Which word of the command is the script: the program itself when it is a path
(``./train.sh``, ``/opt/x/train``) or names a ``.py``/``.sh`` file, else the first
non-option argument of an interpreter (``python``, ``python3.11``, ``bash``, ``sh``,
``torchrun``, ``deepspeed``, ``accelerate launch``...) that names a ``.py``/``.sh`` file or
contains a ``/``. ``python -c`` / ``python -m`` run no file. A bare program name
(``sleep 5``) is looked up on the worker's ``PATH`` and not checked here. Paths are checked
on the service's machine: the working directory is shipped from there, and any other path
must be on storage every node mounts at the same place. The working directory must be
readable by every user of that machine, links included (``sandbox.check_shippable``): the
service ships it with its own rights, and the job owns its copy.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from orchestrator.sandbox import check_shippable
from service.api.errors import ApiError

_INTERPRETER = re.compile(r"^(python[0-9.]*|pypy3?|bash|sh|torchrun|deepspeed|accelerate|"
                          r"uv|launch|run)$")
_SCRIPT_SUFFIXES = (".py", ".sh")


def script_word(argv: list[str]) -> str | None:
    """The word of ``argv`` that names the script to run, or None (see the module doc)."""
    if not argv:
        return None
    prog = argv[0]
    if "/" in prog or prog.endswith(_SCRIPT_SUFFIXES):
        return prog
    if not _INTERPRETER.match(os.path.basename(prog)):
        return None
    for word in argv[1:]:
        if word in ("-c", "-m"):
            return None
        if word.startswith("-") or _INTERPRETER.match(word):
            continue  # an option (``--nproc_per_node=2``), or ``accelerate launch``/``uv run``
        if word.endswith(_SCRIPT_SUFFIXES) or "/" in word:
            return word
    return None


def check_entrypoint(entrypoint: str | None, working_dir: str | None) -> None:
    """422 unless the entrypoint's script (and the working directory) can be found.

    ``working_dir``: an absolute folder the service can read (the CLI makes a job file's
    relative one absolute). A relative script is looked up in it; without one, a relative
    script can never be found (the command starts in an empty private folder)."""
    wd: Path | None = None
    if working_dir is not None:
        if entrypoint is None:
            raise ApiError(422, "working_dir", "is shipped to an entrypoint; give "
                           "'entrypoint' too (e.g. 'python train.py')")
        wd = Path(working_dir).expanduser()
        if not wd.is_absolute():
            raise ApiError(422, "working_dir", f"{working_dir!r} is relative; give an absolute "
                           "folder (frenzy submit makes a job file's relative paths absolute)")
        if not wd.is_dir():
            raise ApiError(422, "working_dir", f"{wd}: no such folder on the service's machine")
        if not os.access(wd, os.R_OK | os.X_OK):
            raise ApiError(422, "working_dir", f"{wd}: the service cannot read this folder")
        try:
            check_shippable(wd)
        except ValueError as exc:
            raise ApiError(422, "working_dir", str(exc)) from None
    if entrypoint is None:
        return
    try:
        argv = shlex.split(entrypoint)
    except ValueError as exc:
        raise ApiError(422, "entrypoint", f"cannot split into words: {exc}") from None
    if not argv:
        raise ApiError(422, "entrypoint", "is empty; give a command such as 'python train.py'")
    word = script_word(argv)
    if word is None:
        return
    script = Path(word).expanduser()
    if script.is_absolute():
        checked = script
    elif wd is not None:
        checked = wd / script
    else:
        raise ApiError(422, "entrypoint", f"the script {word!r} is a relative path but the job "
                       "has no working_dir to find it in: add working_dir (the folder that "
                       "holds it, shipped to the workers) or give an absolute path")
    if not checked.is_file():
        where = "in working_dir " if wd is not None and not script.is_absolute() else ""
        raise ApiError(422, "entrypoint", f"the script {word!r} was not found {where}"
                       f"(checked {checked})")
