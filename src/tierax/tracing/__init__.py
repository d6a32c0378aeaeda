"""Tracing: the activation inventory from an abstract trace, the HBM traffic of the traced
step, and the jaxpr walking both use.
"""
