"""Every HiGHS solve goes through :func:`milp`: ``scipy.optimize.milp`` with the solver's own
output kept off stdout.

HiGHS is C++ and writes some messages (e.g. ``HighsMipSolverData::transformNewIntegerFeasible
Solution tmpSolver.run();``) straight to file descriptor 1, past Python's ``sys.stdout``; a
``--json`` run would then print them before its one JSON document.  While the solve runs, fd 1
points at fd 2 (stderr), so the chatter is still visible to a user but never mixed into stdout.
"""

from __future__ import annotations

import os
import sys

import scipy.optimize


def milp(*args, **kwargs):
    """``scipy.optimize.milp(*args, **kwargs)`` with fd 1 redirected to stderr for the call."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no fd 1 at all (closed stdout): nothing to protect
        return scipy.optimize.milp(*args, **kwargs)
    try:
        os.dup2(2, 1)
        return scipy.optimize.milp(*args, **kwargs)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
