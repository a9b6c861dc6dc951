"""``mpicoll survive PROGRAM [ARGS]``: run one rank so that its death does not end the others.

    mpiexec -disable-auto-cleanup -n 4 mpicoll survive python train.py

MPICH's launcher (Hydra) ends every rank of a node when one of them is killed by a signal,
``-disable-auto-cleanup`` or not: its proxy SIGKILLs the others as soon as it reaps a child
that died of a signal (``src/pm/hydra/proxy/pmip.c``), which it does at its next event -- a
survivor's write to stdout, or at once in about one launch in four. So a job that recovers from
a death (``mpicoll.shrink``) runs each rank under this small parent: it starts PROGRAM, waits,
and exits *normally* with 128 + the signal when PROGRAM was killed, as a shell reports it; the
proxy then ends no one. It ignores ``SIGUSR1`` (Hydra's notice of a death, whose default action
would end it) and passes ``SIGINT`` and ``SIGTERM`` on to PROGRAM. Not needed under Slurm's
``srun --no-kill --kill-on-bad-exit=0`` (docs/reliability.md).
"""

from __future__ import annotations

import os
import signal
import sys

from .cli import Parser

__all__ = ["main"]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    ap = Parser("mpicoll survive", __doc__)
    ap.add_argument("program", nargs="+", help="the rank's command line (python train.py ...), "
                    "taken whole: its options are its own")
    if not argv or argv[0] in ("-h", "--help"):
        ap.parse_args(argv or ["-h"])     # (exits: help, or the missing program's error)
    program = argv
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)       # (inherited by PROGRAM: mpicoll's too)
    child = os.fork()
    if child == 0:
        try:
            os.execvp(program[0], program)
        except OSError as e:
            sys.stderr.write(f"mpicoll survive: cannot run {program[0]!r}: {e}\n")
            os._exit(127)
    for name in ("PMI_FD", "HYDI_CONTROL_FD"):      # the launcher's sockets are PROGRAM's
        try:
            os.close(int(os.environ.get(name, "")))
        except (ValueError, OSError):
            pass
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: os.kill(child, signum))
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code
