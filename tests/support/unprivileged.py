"""The project's Python run as another user, wherever the checkout lies.

A fresh clone may sit under a directory only root may enter (``mktemp -d`` makes them 0700, as CI's may be), and then
another uid reaches neither the code nor the venv. Inside a mount namespace of the test's own, the checkout is
bind-mounted under a directory anyone may enter, and the interpreter and the code are taken from there. The mount is
gone with the namespace: nothing outside the test's directory changes.
"""

from __future__ import annotations

import sys
from pathlib import Path


def checkout_view(root: Path, where: Path) -> tuple[list[str], Path]:
    """Shell lines, to run as root inside the namespace, that show ``root`` at ``where/checkout``; and that path.

    ``where`` must be a directory every user may enter (a 0755 one under /tmp). Each entry of the checkout is bound
    on its own into the view, a 0755 directory: the checkout itself may be 0700 (``git clone URL "$(mktemp -d)"``),
    and a bind of it would keep that mode. What git made inside it follows the umask, so another user may read it."""
    view = where / "checkout"
    view.mkdir(mode=0o755, exist_ok=True)
    view.chmod(0o755)
    lines = []
    for entry in sorted(root.iterdir()):
        target = view / entry.name
        if entry.is_symlink():  # a link (a worktree's .venv) shows as itself: its target's modes decide
            if not target.is_symlink():
                target.symlink_to(entry.readlink())
            continue
        if not (entry.is_dir() or entry.is_file()):
            continue
        if entry.is_dir():
            target.mkdir(exist_ok=True)
        else:
            target.touch()
        lines.append(f"mount --bind {entry} {target}")
    return lines, view


def python_in(view: Path, root: Path) -> str:
    """This interpreter as the view shows it: the checkout's venv through the mount, any other one as it is."""
    try:
        return str(view / Path(sys.executable).relative_to(root))
    except ValueError:
        return sys.executable
