"""Integrations that run curvecast's forecast inside another tool, with no server:

* :mod:`curvecast.integrations.optuna`: ``CurvecastPruner``, an Optuna pruner that stops the
  trials a calibrated forecast gives too little chance of beating the best (the ``[optuna]``
  extra).

They import the fit and the decision core (numpy, scipy, pydantic), so they are not part of
the client, which is the standard library and the contract only: the training loop's callbacks
(Lightning, Hugging Face) are in :mod:`curvecast.client.integrations`.
"""
