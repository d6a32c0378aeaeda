"""Solving: the exact planner, the one solve path every verb uses, the MaxText-constrained solve,
the mesh search, what-ifs and ``plan --check``.
"""
