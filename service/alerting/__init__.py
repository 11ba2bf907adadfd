"""Alerting: pure rule evaluation, the alert lifecycle, webhook payloads and signatures, and the
worker tasks that evaluate runs and deliver webhooks through a database outbox."""
