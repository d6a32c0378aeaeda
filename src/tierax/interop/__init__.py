"""Other tools' formats: MaxText overrides and model YAMLs, Hugging Face ``config.json``.

* :mod:`tierax.interop.maxtext_keys` — MaxText's ``remat_policy: custom`` keys; an
  override file read back as a plan (no dependency on :mod:`tierax.plan`, which calls it).
* :mod:`tierax.interop.maxtext` — a Plan (plus sizes, mesh, schedule) written as MaxText overrides.
* :mod:`tierax.interop.model_files` — MaxText model YAMLs and Hugging Face configs read as
  ModelConfigs.
"""
