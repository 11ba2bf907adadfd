"""Encoding records into columnar batches (what goes on the wire and into the spool)."""

from __future__ import annotations

import json
import math

import torch

from curvecast.client._batcher import Outbox, encode_records, split_batch


def decode(batches):
    return [json.loads(b.body) for b in batches]


def test_rows_merge_by_step_and_first_value_wins() -> None:
    batches, bad = encode_records(
        [(1, 10.0, {"loss": 1.0}, None), (1, 11.0, {"lr": 0.1, "loss": 9.0}, None),
         (2, 12.0, {"loss": 2.0}, None)]
    )
    [data] = decode(batches)
    assert bad == 0 and batches[0].points == 3  # the repeated loss at step 1 is not sent
    assert data == {"steps": [1, 2], "wall_time": [10.0, 12.0],
                    "values": {"loss": [1.0, 2.0], "lr": [0.1, None]}}


def test_values_become_floats_tensors_read_in_one_go() -> None:
    records = [(0, 0.0, {"i": 3, "big": 10**400, "neg": -(10**400), "nan": math.nan,
                         "inf": -math.inf, "t32": torch.tensor(0.25),
                         "bf16": torch.tensor(1.5, dtype=torch.bfloat16),
                         "int_t": torch.tensor(7), "one": torch.ones(1, 1)}, None)]
    [data] = decode(encode_records(records)[0])
    v = {k: c[0] for k, c in data["values"].items()}
    assert v["i"] == 3.0 and isinstance(v["i"], float)
    assert v["big"] == math.inf and v["neg"] == -math.inf
    assert math.isnan(v["nan"]) and v["inf"] == -math.inf
    assert v["t32"] == 0.25 and v["bf16"] == 1.5 and v["int_t"] == 7.0 and v["one"] == 1.0


def test_max_points_and_max_keys_split_batches() -> None:
    records = [(s, 0.0, {"a": 1.0, "b": 2.0}, None) for s in range(10)]
    batches, _ = encode_records(records, max_points=6)
    assert [b.points for b in batches] == [6, 6, 6, 2]
    wide = [(0, 0.0, {f"k{i}": 1.0 for i in range(5)}, None)]
    batches, _ = encode_records(wide, max_keys=2)
    assert [sorted(d["values"]) for d in decode(batches)] == [["k0", "k1"], ["k2", "k3"], ["k4"]]


def test_split_batch_halves_rows() -> None:
    [batch], _ = encode_records([(s, 0.0, {"a": float(s)}, None) for s in range(5)])
    parts = split_batch(batch)
    assert [json.loads(p.body)["steps"] for p in parts] == [[0, 1], [2, 3, 4]]
    assert sum(p.points for p in parts) == 5


def test_outbox_is_bounded_and_acks_by_identity() -> None:
    out = Outbox(max_bytes=100)
    [big], _ = encode_records([(s, 0.0, {"a": 1.0}, None) for s in range(20)])
    assert len(big.body) > 100
    assert out.offer(big)  # an empty outbox takes one oversized batch: progress is possible
    [small], _ = encode_records([(0, 0.0, {"a": 1.0}, None)])
    assert not out.offer(small)
    out.ack(small)  # not the head: ignored
    assert out.peek() is big
    out.ack(big)
    assert out.nbytes == 0 and out.offer(small)
    out.online = False
    assert not out.offer(small)


def test_keymap_prefixes_in_the_background_and_drops_bad_names() -> None:
    from curvecast.client._batcher import KeyMap

    keymap = KeyMap("opt/", skip=("step",))
    stats = {"step": 3.0, "eta": 0.5, "bad name": 1.0, "n": 2}
    [data] = decode(encode_records([(3, 0.0, stats, keymap)])[0])
    assert data["values"] == {"opt/eta": [0.5], "opt/n": [2.0]}
