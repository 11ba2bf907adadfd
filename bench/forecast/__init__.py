"""The forecast: accuracy and interval coverage on real curves, calibration, off_model."""
