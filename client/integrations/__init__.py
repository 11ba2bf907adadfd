"""Integrations with training frameworks. Import the one you use (each needs its library):

* :mod:`curvecast.client.integrations.lightning`: ``CurvecastCallback`` for PyTorch Lightning.
* :mod:`curvecast.client.integrations.transformers`: ``CurvecastCallback`` for the Hugging Face
``Trainer``.
"""
