"""NVLink packetisation."""

from cais.config import PacketFormat
from cais.hw.packets import Kind, Packetizer

NVLINK = PacketFormat(request_extra_flits=1, write_extra_flits=1)
PAPER = PacketFormat()


def test_paper_format_is_one_header_flit_per_128_byte_packet() -> None:
    pk = Packetizer(PAPER)
    assert pk.wire(Kind.WRITE, 128) == (144, 144)
    assert pk.wire(Kind.READ_RESP, 1024) == (8 * 144, 144)
    assert pk.wire(Kind.READ_REQ, 1024) == (8 * 16, 16)


def test_nvlink_format_adds_address_and_byte_enable_flits() -> None:
    pk = Packetizer(NVLINK)
    assert pk.wire(Kind.WRITE, 128) == (160, 160)
    assert pk.wire(Kind.MC_STORE, 256) == (320, 160)
    assert pk.wire(Kind.READ_REQ, 256) == (2 * 32, 32)
    assert pk.wire(Kind.READ_RESP, 128) == (144, 144)  # responses carry no extra flits


def test_partial_packets_round_up_to_whole_flits() -> None:
    pk = Packetizer(PAPER)
    total, last = pk.wire(Kind.WRITE, 130)  # 128 B + a 2 B packet
    assert total == 144 + 32 and last == 32
