"""The codec contract's pieces: how a channel cuts a wire, what a bucket's scratch keeps, what a codec promises."""

import pytest
import torch

from scalesgd.comm.codecs import Channel, Codec, Piece, Scratch
from scalesgd.comm.codecs.base import Exchange


def test_a_channel_cuts_pieces_of_its_bytes_rounded_to_the_parts_a_sum_makes():
    channel = Channel(None, 4, piece_bytes=1000)
    assert channel.bounds(2500, 4) == [(0, 250), (250, 500), (500, 750), (750, 1000), (1000, 1250), (1250, 1500),
                                       (1500, 1750), (1750, 2000), (2000, 2250), (2250, 2500)]
    assert channel.bounds(2500, 1, multiple=3) == [(0, 1002), (1002, 2004), (2004, 2500)]  # 1000 up to ×3
    assert channel.bounds(0, 4) == [(0, 0)]  # an empty bucket is one empty piece: every rank posts the same
    small = Channel(None, 4, piece_bytes=16)
    assert small.bounds(10, 8, multiple=4) == [(0, 4), (4, 8), (8, 10)]  # 2 elements rounded up to a multiple of 4


def test_scratch_keeps_a_buffer_while_its_shape_holds_and_slots_keep_pieces_in_flight_apart():
    scratch = Scratch()
    wire = scratch.tensor("wire", 10, torch.uint8, torch.device("cpu"))
    wire.fill_(7)
    assert scratch.tensor("wire", 10, torch.uint8, "cpu") is wire
    again = scratch.tensor("wire", 11, torch.uint8, "cpu")
    assert again is not wire and not again.any()  # a new size: a new buffer, zeroed
    first, second = (scratch.slot(Piece(i, slot=i % 2), "sum", 4, torch.float32, "cpu") for i in range(2))
    assert first is not second and scratch.slot(Piece(2, slot=0), "sum", 4, torch.float32, "cpu") is first
    made = []
    assert scratch.memo("scale", 1, lambda: made.append(1) or "a") == "a"
    assert scratch.memo("scale", 1, lambda: made.append(1) or "b") == "a" and made == [1]
    assert scratch.memo("scale", 2, lambda: "c") == "c"  # the key changed: made again


def test_a_codec_without_state_refuses_state_and_an_exchange_must_say_its_transfer():
    class Plain(Codec):
        name = "plain"

        def start(self, flat, bucket, channel, scratch):
            return None

    assert Plain().state_dict() == {} and Plain().counters() == {} and Plain().pop_notices() == []
    Plain().load_state_dict({})
    with pytest.raises(ValueError, match="codec plain keeps no state, got keys"):
        Plain().load_state_dict({"residual": 1})
    with pytest.raises(TypeError):
        Exchange()  # transfer is the one part every exchange has
    with pytest.raises(TypeError):
        Codec()  # and start the one part every codec has
