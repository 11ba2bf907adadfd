"""curvecast service: stores training-run metrics, forecasts loss curves, raises drift alerts."""

__version__ = "0.2.0"
