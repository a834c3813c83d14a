"""Every wire type survives encode/decode unchanged; bad envelopes are refused."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from shared import messages as m
from shared.vision_config import image_pseudo_id

SP = m.SamplingParams(
    max_new_tokens=7,
    min_new_tokens=2,
    do_sample=True,
    temperature=0.7,
    top_p=0.9,
    top_k=40,
    presence_penalty=0.5,
    frequency_penalty=0.25,
    repetition_penalty=1.1,
    ignore_eos=True,
    stop_token_ids=[5, 9],
    seed=123,
    logprobs=True,
    top_logprobs=3,
)
GEN = m.GenerateReq("r1", "front-0", "detok-0", [1, 2, 3], SP, 1700000000.5, 1700000600.0)
SCHEMA = '{"type": "object", "properties": {"név": {"type": "string"}}, "required": ["név"]}'
CONSTRAINED = m.GenerateReq(
    "r2",
    "front-0",
    "detok-0",
    [4],
    m.SamplingParams(constraint=m.Constraint(m.CONSTRAINT_JSON_SCHEMA, SCHEMA)),
    1.0,
    2.0,
)
RESUMED = m.GenerateReq("r2", "front-0", "detok-0", [1, 2, 3, 9, 8], SP, 1700000000.5, 1700000600.0, 2, 1)

H1, H2 = "ab" * 32, "cd" * 32
WITH_IMAGES = m.GenerateReq(
    "r3",
    "front-0",
    "detok-0",
    [1, -5, -5, 2, -7, 3],
    SP,
    1.0,
    2.0,
    images=[m.ImageRef(H1, 1, 2), m.ImageRef(H2, 4, 1, [1, 1, 1])],
)

EXAMPLES = [
    GEN,
    WITH_IMAGES,
    m.VisualReq(WITH_IMAGES, [m.ImageData(H1, b"\x89PNG..."), m.ImageData(H2, b"\xff\xd8")]),
    m.ImageEmbedding("float32", [2, 3], bytes(24)),
    m.AbortReq("r1", "client disconnected"),
    m.WorkerStatus(
        group="0",
        instance="abc",
        capacity_tokens=4096,
        free_tokens=1000,
        max_running=64,
        admit_seq=12,
        running=m.RunningTable.of(
            [m.RunningReq("r1", "detok-0", 3, 10, 6, False, 3), m.RunningReq("r2", "detok-1", 4, 4, 16, True)]
        ),
        time=1.5,
        evictable_tokens=500,
        cache_locked_tokens=3,
        prompt_cache=True,
        draining=True,
    ),
    m.AdmitReqs("abc", 13, [GEN, RESUMED, CONSTRAINED]),
    m.Handover(RESUMED, "worker group 0 died"),
    m.AbortReqs(["r1", "r2"], "aborted"),
    m.DetokRegister("r1", "front-0", 3, ["\n\n", "Ünïcode ✓"], False, 1700000600.0),
    m.TokenBatch(
        "worker:0",
        [
            m.TokenItem(
                "r1",
                [42],
                [-0.5],
                [[[42.0, -0.5], [7.0, -1.5]]],
                prompt_tokens=3,
                output_tokens=1,
                cached_tokens=2,
                handovers=1,
            ),
            m.TokenItem(
                "r2",
                [],
                finish_reason=m.FINISH_ERROR,
                error="worker group 0 died",
                error_kind=m.ERR_FAILED,
                prompt_tokens=4,
            ),
        ],
    ),
    m.TextBatch(
        [m.TextItem("r1", "héllo 世界", [42, 43], [-0.1, -0.2], [], m.FINISH_STOP, prompt_tokens=3, output_tokens=2)]
    ),
    m.Heartbeat("worker", "0", 1234, 1.0, 2.0, {"free_tokens": 10.0}),
]


def test_every_type_has_an_example() -> None:
    assert {type(x) for x in EXAMPLES} == set(m.MESSAGE_TYPES)


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda x: type(x).__name__)
def test_round_trip(msg: object) -> None:
    data = m.encode(msg)
    assert isinstance(data, bytes)
    assert m.decode(data) == msg


def test_other_schema_version_is_refused() -> None:
    raw = msgpack.unpackb(m.encode(EXAMPLES[1]))
    raw[0] = m.SCHEMA_VERSION + 1
    with pytest.raises(m.WireError, match="schema version"):
        m.decode(msgpack.packb(raw))


def test_unknown_type_and_bad_shapes_are_refused() -> None:
    with pytest.raises(m.WireError, match="unknown message type"):
        m.decode(msgpack.packb([m.SCHEMA_VERSION, "nope", 1]))
    with pytest.raises(m.WireError, match="expected 2 fields"):
        m.decode(msgpack.packb([m.SCHEMA_VERSION, "abort", "only-one-field"]))
    with pytest.raises(m.WireError, match="not msgpack"):
        m.decode(b"\xc1")
    with pytest.raises(m.WireError, match="not a wire message"):
        m.encode(SP)
    ragged = [
        m.SCHEMA_VERSION,
        "wstat",
        "0",
        "x",
        100,
        40,
        8,
        3,
        [["r1", "r2"], ["d0"], [5], [9], [7], [True], [0]],
        1.5,
        0,
        0,
        False,
        False,
        False,
    ]
    with pytest.raises(m.WireError, match="columns of different lengths"):
        m.decode(msgpack.packb(ragged))


def test_a_resumed_request_keeps_a_prompt() -> None:
    assert RESUMED.prompt_len == 3 and GEN.prompt_len == 3
    for resumed, handovers in ((5, 1), (-1, 0), (0, -1)):
        raw = msgpack.unpackb(m.encode(RESUMED))
        raw[-3:-1] = [resumed, handovers]  # before images
        with pytest.raises(m.WireError, match="resumed"):
            m.decode(msgpack.packb(raw))


def test_sampling_greedy_flag() -> None:
    assert m.SamplingParams().greedy
    assert not m.SamplingParams(do_sample=True, temperature=0.8).greedy
    assert m.SamplingParams(do_sample=True, top_k=1).greedy


def test_the_wire_layout_is_fields_in_declaration_order_nested_as_arrays() -> None:
    # pinned by hand: a service built before or after a change to the codec reads the same bytes
    running = m.RunningTable.of([m.RunningReq("r1", "d0", 5, 9, 7, True), m.RunningReq("r2", "d1", 6, 6, 3, False)])
    status = m.WorkerStatus("0", "x", 100, 40, 8, 3, running, 1.5)
    columns = [["r1", "r2"], ["d0", "d1"], [5, 6], [9, 6], [7, 3], [True, False], [0, 0]]
    assert m.encode(status) == msgpack.packb(
        [m.SCHEMA_VERSION, "wstat", "0", "x", 100, 40, 8, 3, columns, 1.5, 0, 0, False, False, False], use_bin_type=True
    )
    assert running.rows()[1] == m.RunningReq("r2", "d1", 6, 6, 3, False)
    gen = m.GenerateReq("r", "f", "d", [1, 2], m.SamplingParams(max_new_tokens=4), 1.0, 2.0)
    raw = msgpack.unpackb(m.encode(gen))
    assert raw[:6] == [m.SCHEMA_VERSION, "gen", "r", "f", "d", [1, 2]] and raw[6][0] == 4
    assert m.decode(m.encode(status)) == status and m.decode(m.encode(gen)) == gen


CONSTRAINT = [f.name for f in dataclasses.fields(m.SamplingParams)].index("constraint")  # its place in the array


@pytest.mark.parametrize("kind", m.CONSTRAINT_KINDS)
def test_a_constraint_of_each_kind_round_trips(kind: str) -> None:
    gen = m.GenerateReq("r", "f", "d", [1], m.SamplingParams(constraint=m.Constraint(kind, '["a", "b"]', 7)), 1.0, 2.0)
    assert m.decode(m.encode(gen)) == gen
    assert msgpack.unpackb(m.encode(gen))[6][CONSTRAINT] == [kind, '["a", "b"]', 7]  # a nested array
    assert m.decode(m.encode(CONSTRAINED)).params.constraint.text == SCHEMA


def test_an_unknown_constraint_kind_is_refused() -> None:
    raw = msgpack.unpackb(m.encode(CONSTRAINED))
    raw[6][CONSTRAINT][0] = "lark"
    with pytest.raises(m.WireError, match="unknown kind 'lark'"):
        m.decode(msgpack.packb(raw))
    with pytest.raises(m.WireError, match="unknown kind"):
        m.Constraint("yaml", "")


def test_images_must_lie_in_the_prompt_in_order() -> None:
    with pytest.raises(m.WireError, match="image at 2"):
        m.GenerateReq("r", "f", "d", [1, 2, 3], SP, 1.0, 2.0, images=[m.ImageRef(H1, 2, 2)])
    with pytest.raises(m.WireError, match="overlaps"):
        m.GenerateReq("r", "f", "d", [1, 2, 3, 4], SP, 1.0, 2.0, images=[m.ImageRef(H1, 0, 2), m.ImageRef(H2, 1, 1)])
    with pytest.raises(m.WireError, match="grid"):
        m.ImageRef(H1, 0, 4, [1, 2, 3])
    with pytest.raises(m.WireError, match="ImageEmbedding"):
        m.ImageEmbedding("float32", [2, 3], bytes(20))


def test_image_pseudo_ids_are_below_placeholder_and_differ_per_image() -> None:
    a, b = image_pseudo_id(H1), image_pseudo_id(H2)
    assert a < -1 and b < -1 and a != b and a == image_pseudo_id(H1)
