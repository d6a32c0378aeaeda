"""XLA: compiling tierax's step for a target (deviceless or local), reading the result, its
out-of-memory reports and its HLO.
"""
