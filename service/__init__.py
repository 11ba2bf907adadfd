"""curvecast service: stores training-run metrics, forecasts loss curves, raises drift alerts."""

__version__ = "0.1.0"
