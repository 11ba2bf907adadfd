"""Deprecated: the integrations moved to :mod:`curvecast.integrations` (0.3.0)."""
