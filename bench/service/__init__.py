"""The service: ingest, reads, dashboards, the worker, requests under load, storage."""
