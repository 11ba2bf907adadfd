"""Integrations that run the service's forecast offline, inside another tool (no server):

* :mod:`curvecast.service.integrations.optuna`: ``CurvecastPruner``, an Optuna pruner that
  stops the trials a calibrated forecast gives too little chance of beating the best (the
  ``[optuna]`` extra).

They live here, not in :mod:`curvecast.client.integrations`, because they import the fit and
the decision core (numpy, scipy, pydantic): the client is the standard library and the
contract only.
"""
