"""Integrations with training frameworks. Import the one you use (each needs its library):

* :mod:`curvecast.client.integrations.lightning`: ``CurvecastCallback`` for PyTorch Lightning.
* :mod:`curvecast.client.integrations.transformers`: ``CurvecastCallback`` for the Hugging Face
``Trainer``.
* :mod:`curvecast.client.integrations.optuna`: ``CurvecastPruner``, an Optuna pruner that stops
  the trials a calibrated forecast gives too little chance of beating the best (needs the
  ``[optuna]`` extra: it runs the service's fit offline).
"""
