"""Other tools' formats: MaxText overrides and model YAMLs, Hugging Face ``config.json``.

* :mod:`tierax.interop.files` — the one place that tells other tools' files from tierax's: model
  configs and plans as the command line and the training config read them.
* :mod:`tierax.interop.maxtext_keys` — MaxText's ``remat_policy: custom`` keys; an
  override file read back as a plan.
* :mod:`tierax.interop.maxtext` — a Plan (plus sizes, mesh, schedule) written as MaxText overrides.
* :mod:`tierax.interop.model_files` — MaxText model YAMLs and Hugging Face configs read as
  ModelConfigs.
"""
