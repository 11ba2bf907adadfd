"""The alert rules on real runs: false alarms, detection delay, gradient-norm drift."""
