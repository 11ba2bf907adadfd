"""Integrations with training frameworks. Import the one you use (each needs its library):

* :mod:`client.integrations.lightning`: ``CurvecastCallback`` for PyTorch Lightning.
* :mod:`client.integrations.transformers`: ``CurvecastCallback`` for the Hugging Face ``Trainer``.
"""
