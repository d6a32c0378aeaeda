"""tierax: keep, offload or recompute each training activation — planned, applied, checked.

The Python API for your own model (see :mod:`tierax.api`)::

    import tierax
    inv = tierax.inventory(loss_fn, params, batch)
    planned = tierax.plan(inv, target="h200", mesh={"fsdp": 8}, budget=60 * 2**30)
    policy = planned.policy("decoder")          # a jax.checkpoint policy
    # a plan kept as YAML (in your model's own checkpoint_name tags), checked against the trace:
    policy = tierax.api.policy("plan.yaml", inv, "decoder")

``tierax.inventory`` and ``tierax.plan`` are also the modules :mod:`tierax.tracing.inventory`
and :mod:`tierax.plan`; calling them calls :func:`tierax.api.inventory` and
:func:`tierax.api.plan`.  Importing ``tierax`` imports nothing else (no JAX): the
modules load on first use.
"""

from __future__ import annotations

import importlib
import sys
import types

_CALLABLE = {"inventory": "tierax.tracing.inventory", "plan": "tierax.plan"}


class _CallableModule(types.ModuleType):
    """A submodule that is also the API function of the same name."""

    def __call__(self, *args, **kwargs):
        from tierax import api

        return getattr(api, self.__name__.rsplit(".", 1)[1])(*args, **kwargs)


class _Package(types.ModuleType):
    def __setattr__(self, name, value):
        if (
            name in _CALLABLE
            and isinstance(value, types.ModuleType)
            and not isinstance(value, _CallableModule)
        ):
            value.__class__ = _CallableModule  # set when the import system binds the submodule
        super().__setattr__(name, value)

    def __getattr__(self, name):  # only for attributes not yet bound
        if name in _CALLABLE:
            module = importlib.import_module(_CALLABLE[name])
            if not isinstance(module, _CallableModule):
                module.__class__ = _CallableModule
            return module
        if name == "api":  # tierax.api.policy(...) after a bare `import tierax`
            return importlib.import_module("tierax.api")
        raise AttributeError(f"module 'tierax' has no attribute {name!r}")


sys.modules[__name__].__class__ = _Package
