"""Encoding records into columnar batches (what goes on the wire and into the spool)."""

from __future__ import annotations

import base64
import json
import math
from array import array

import torch

from curvecast.client._batcher import (
    Outbox,
    count_points,
    encode_records,
    plain_body,
    split_batch,
)


def decode(batches):
    """The bodies as plain JSON arrays (what an older service is sent)."""
    return [json.loads(plain_body(b.body)) for b in batches]


def test_dense_columns_travel_as_base64_of_their_bytes() -> None:
    """Steps as int64, wall times and every column without a gap as float64, bit for bit
    (NaN, infinities, -0.0 and 17-digit values included); a column with gaps stays an array."""
    values = [0.1, -0.0, math.nan, math.inf, -math.inf, 1 / 3, 5e-324]
    records = [(s, 1.7e9 + s / 7, {"v": v}, None) for s, v in enumerate(values)]
    records.append((3, 0.0, {"sparse": 2.5}, None))
    [batch], _ = encode_records(records)
    data = json.loads(batch.body)
    assert data["steps"] == base64.b64encode(array("q", range(7)).tobytes()).decode()
    assert data["wall_time"] == base64.b64encode(
        array("d", [1.7e9 + s / 7 for s in range(7)]).tobytes()).decode()
    assert base64.b64decode(data["values"]["v"]) == array("d", values).tobytes()
    assert data["values"]["sparse"] == [None, None, None, 2.5, None, None, None]
    assert batch.points == 8 == count_points(data)
    plain = json.loads(plain_body(batch.body))
    assert plain["steps"] == list(range(7)) and plain["values"]["sparse"][3] == 2.5
    assert [math.copysign(1, v) for v in plain["values"]["v"][:2]] == [1, -1]
    assert plain_body(plain_body(batch.body)) == plain_body(batch.body)  # plain stays plain


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
    assert [json.loads(plain_body(p.body))["steps"] for p in parts] == [[0, 1], [2, 3, 4]]
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


def _points(batches) -> dict[tuple[str, int], float]:
    """(key, step) -> value of every non-null value in ``batches``."""
    out: dict[tuple[str, int], float] = {}
    for data in decode(batches):
        for key, column in data["values"].items():
            for step, value in zip(data["steps"], column, strict=True):
                if value is not None:
                    assert (key, step) not in out  # a point appears once
                    out[key, step] = value
    return out


def _first_wins(records) -> dict[tuple[str, int], float]:
    """What encoding must keep: the first value of each (name, step), in record order."""
    from curvecast.client._batcher import KeyMap

    out: dict[tuple[str, int], float] = {}
    for step, _, metrics, keymap in records:
        for key, value in metrics.items():
            name = keymap.name(key) if isinstance(keymap, KeyMap) else key
            if name is not None:
                out.setdefault((name, step), float(value))
    return out


def test_shapes_are_columns_and_first_values_win_in_record_order() -> None:
    """Records are turned into columns by shape (key map and key order); every mix of shapes
    keeps exactly the first value of each (name, step), and each row the wall time of a record
    of its step."""
    from curvecast.client._batcher import KeyMap

    keymap = KeyMap("opt/", skip=("step",))
    stats = [(s, 100.0 + s, {"step": float(s), "eta": s / 3, "c": 0.5}, keymap)
             for s in range(1, 9)]
    logged = [(s, 200.0 + s, {"loss": s / 7, "tokens": 64 * s}, None) for s in range(1, 9)]
    norms = [(s, 300.0 + s, {"x_l2": s * 1.5}, keymap) for s in (4, 8)]
    evals = [(s, 400.0 + s, {"eval/loss": s / 11, "loss": 9.0}, None) for s in (3, 6)]
    cases = {
        "aligned": [r for pair in zip(stats, logged, strict=True) for r in pair],
        "sparse shapes": [*stats, *logged, *norms],
        # eval records repeat "loss" at steps 3 and 6: the step's earlier "loss" wins...
        "shared name": [r for pair in zip(logged, stats, strict=True) for r in pair] + evals,
        # ...and when the eval record comes first, its value wins.
        "shared name first": [*evals, *logged],
        "step twice": [*logged, (2, 500.0, {"loss": 5.0, "tokens": 1}, None)],
        "keys in another order": [*logged, (9, 600.0, {"tokens": 1, "loss": 2.0}, None)],
        "going backwards": [*logged[4:], *logged[:4]],
    }
    for name, records in cases.items():
        batches, bad = encode_records(records)
        assert bad == 0, name
        assert _points(batches) == _first_wins(records), name
        assert sum(b.points for b in batches) == len(_first_wins(records)), name
        for data in decode(batches):
            for step, wall in zip(data["steps"], data["wall_time"], strict=True):
                assert wall in {w for s, w, _, _ in records if s == step}, name


def test_columns_of_tensors_are_read_exactly_in_one_go() -> None:
    """A column of 0-d CPU tensors (``log()`` reads plain ones itself; these come from tensor
    subclasses or an optimizer's statistics) is read in one C loop; values are exact (no
    float32 detour) and a column mixing dtypes or numbers works."""
    big = 2**40 + 1  # exact in float64, not in float32
    records = [
        (s, 0.0, {"f32": torch.tensor(s / 3, dtype=torch.float32),
                  "f64": torch.tensor(s / 3, dtype=torch.float64),
                  "bf16": torch.tensor(s + 0.5, dtype=torch.bfloat16),
                  "i64": torch.tensor(big + s),
                  "mixed": torch.tensor(s / 3) if s % 2 else s / 3,
                  "dtypes": torch.tensor(s) if s % 2 else torch.tensor(s / 4)}, None)
        for s in range(6)
    ]
    [data] = decode(encode_records(records)[0])
    v = data["values"]
    assert v["f32"] == [float(torch.tensor(s / 3, dtype=torch.float32)) for s in range(6)]
    assert v["f64"] == [s / 3 for s in range(6)]
    assert v["bf16"] == [s + 0.5 for s in range(6)]
    assert v["i64"] == [float(big + s) for s in range(6)]
    assert v["mixed"] == [s / 3 if s % 2 == 0 else float(torch.tensor(s / 3)) for s in range(6)]
    assert v["dtypes"] == [float(s) if s % 2 else float(torch.tensor(s / 4)) for s in range(6)]


def test_a_column_of_tensors_with_an_unreadable_one_keeps_the_others() -> None:
    """A column whose CPU tensors cannot all be read as scalars (one holds two values, as an
    optimizer's stats might) falls back to reading value by value: the readable values are
    kept, the other is dropped and counted. A column on a device that cannot be read (meta)
    is dropped and counted value by value, without failing the batch."""
    records = [
        (s, 0.0, {"cpu": torch.tensor([1.0, 2.0]) if s == 1 else torch.tensor(s / 4),
                  "meta": torch.tensor(float(s), device="meta"), "ok": float(s)}, None)
        for s in range(3)
    ]
    batches, unreadable = encode_records(records)
    [data] = decode(batches)
    assert unreadable == 1 + 3
    assert data["values"]["cpu"] == [0.0, None, 0.5]
    assert data["values"]["meta"] == [None, None, None]  # no points, nothing else lost
    assert data["values"]["ok"] == [0.0, 1.0, 2.0]


def test_rows_are_in_step_order_when_shapes_interleave() -> None:
    """A key logged with an extra one every few steps makes two shapes; the rows still come out
    in step order (what the service stores without sorting)."""
    records = [(s, float(s), {"loss": s / 7, "acc": 0.5} if s % 3 == 0 else {"loss": s / 7},
                None) for s in range(1, 10)]
    [data] = decode(encode_records(records)[0])
    assert data["steps"] == list(range(1, 10))
    assert data["wall_time"] == [float(s) for s in range(1, 10)]
    assert data["values"]["loss"] == [s / 7 for s in range(1, 10)]
    assert data["values"]["acc"] == [0.5 if s % 3 == 0 else None for s in range(1, 10)]
