"""Sharding: the parameter and batch sharding rules and the gathered-weight layout, below
the inventory and the cost model that price them.
"""
