"""Alerting, all of it pure: the rules (:mod:`.rules`), the alert lifecycle (:mod:`.lifecycle`),
one evaluation round and replays of stored data (:mod:`.engine`), what a round writes
(:mod:`.decisions`), and webhook payloads and signatures (:mod:`.webhook`). The worker
(``curvecast.service.worker``) reads, calls these, and has the store write the outcome."""
