#!/usr/bin/env python3
"""Writes the seed corpora of fuzz/corpus/<target>/: a handful of valid
frames of each kind, in each target's input format (see the target's doc
comment), and the packets of the real RNIC capture for roce. Pure Python
(no scapy); run from anywhere: python3 fuzz/seeds.py [CAPTURE.pcap]."""

import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CAPTURE = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    HERE, "..", "testdata", "rnic_roce_ud_send.pcap")

US_MAC = bytes([2, 0, 0, 0, 0, 1])
PEER_MAC = bytes([2, 0, 0, 0, 0, 2])
US = bytes([10, 0, 0, 1])
PEER = bytes([10, 0, 0, 2])


def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def eth(payload, ethertype=0x0800, dst=US_MAC):
    return dst + PEER_MAC + struct.pack("!H", ethertype) + payload


def ipv4(proto, body, ident=1, flags_off=0x4000, opts=b""):
    hl = 20 + len(opts)
    h = struct.pack("!BBHHHBBH4s4s", 0x40 | hl // 4, 0, hl + len(body), ident,
                    flags_off, 64, proto, 0, PEER, US) + opts
    h = h[:10] + struct.pack("!H", csum(h)) + h[12:]
    return h + body


def pseudo(proto, seg):
    return PEER + US + struct.pack("!BBH", 0, proto, len(seg))


def udp(dport, data, sport=1234):
    u = struct.pack("!HHHH", sport, dport, 8 + len(data), 0) + data
    c = csum(pseudo(17, u) + u) or 0xFFFF
    return u[:6] + struct.pack("!H", c) + u[8:]


def tcp(dport, seq, ack, flags, opts=b"", data=b"", sport=40000, win=65535):
    hl = 20 + len(opts)
    t = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, (hl // 4) << 4, flags,
                    win, 0, 0) + opts + data
    return t[:16] + struct.pack("!H", csum(pseudo(6, t) + t)) + t[18:]


def icmp_echo(ident=1, seq=1, data=b"\x55" * 56, typ=8):
    m = struct.pack("!BBHHH", typ, 0, 0, ident, seq) + data
    return m[:2] + struct.pack("!H", csum(m)) + m[4:]


def arp(op=1, spa=PEER, tpa=US, sha=PEER_MAC):
    return struct.pack("!HHBBH", 1, 0x0800, 6, 4, op) + sha + spa + bytes(6) + tpa


SYN_OPTS = bytes([2, 4, 5, 0xB4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7])


def roce_payloads():
    """UDP payloads (BTH..ICRC) of the UDP 4791 packets of a pcap file."""
    out = []
    try:
        raw = open(CAPTURE, "rb").read()
    except OSError:
        return out
    end = "<" if raw[:4] == b"\xd4\xc3\xb2\xa1" else ">"
    at = 24
    while at + 16 <= len(raw):
        _, _, incl, _ = struct.unpack(end + "IIII", raw[at:at + 16])
        pkt = raw[at + 16:at + 16 + incl]
        at += 16 + incl
        if len(pkt) < 42 or pkt[12:14] != b"\x08\x00":
            continue
        ihl = (pkt[14] & 15) * 4
        u = pkt[14 + ihl:]
        if pkt[23] == 17 and struct.unpack("!H", u[2:4])[0] == 4791:
            out.append(u[8:])
    return out


def chunk(b):
    assert len(b) <= 255
    return bytes([len(b)]) + b


def frames():
    syn = tcp(5001, 1000, 0, 0x02, SYN_OPTS)
    u = udp(7, b"\xab" * 32)
    return [
        eth(arp(), 0x0806),
        eth(ipv4(1, icmp_echo())),
        eth(ipv4(17, u)),
        eth(ipv4(17, udp(9, b"x"))),
        eth(ipv4(17, u[:16], ident=77, flags_off=0x2000)),
        eth(ipv4(17, u[16:], ident=77, flags_off=2)),
        eth(ipv4(6, syn)),
        eth(ipv4(6, tcp(80, 1, 0, 0x02))),
        eth(ipv4(17, udp(4791, roce_payloads()[0] if roce_payloads() else b""), opts=b"\x01\x01\x01\x00")),
    ]


def rc_op(kind, side, hi=0):
    """An rc op byte: op % 13 == kind, bit 4 the side, bits 6-7 as `hi`."""
    for op in range(256):
        if op % 13 == kind and (op >> 4) & 1 == side and op & 0xC0 == hi:
            return op
    raise ValueError((kind, side, hi))


def rc_crafted(side, opcode, psn_sel=0, delta=0, syndrome=0, plen=0, rsel=0, va_off=0, flags=0x08):
    """A crafted-packet op of the rc target (fields in the order it reads them)."""
    more = 1  # payload length as a byte; DMA length = payload length
    b = bytes([rc_op(0, side), flags, more, opcode, psn_sel, delta & 0xFF])
    b += bytes([rsel]) + struct.pack("!H", va_off) + bytes([plen, 0x5A, syndrome])
    return b + struct.pack("!IIII", 0, 0xDEADBEEF, 0, 0)


def rc_header(c0=0xFC, c1=12 << 3 | 6, c2=0, sizes=(3000, 1000, 2000, 100, 4096, 257), progress=50):
    return bytes([c0, c1, c2]) + struct.pack("!6H", *sizes) + bytes([progress])


def rc_seeds():
    jump = lambda t: bytes([rc_op(9, 0), t])
    poll = lambda side: bytes([rc_op(8, side), 19])
    life = lambda side, b: bytes([rc_op(10, side), b])
    clean = (rc_header() + jump(0x85) + poll(0) + poll(1)
             # A: SEND 600 B from the live region; B: a receive for it.
             + bytes([rc_op(7, 1), 0]) + struct.pack("!HH", 4096, 4096)
             + bytes([rc_op(6, 0), 0, 2]) + struct.pack("!H", 600) + bytes([0]) + struct.pack("!H", 0)
             + struct.pack("!I", 0) + bytes([1]) + struct.pack("!H", 0)
             + jump(0x85) + poll(0) + poll(1))
    acks = rc_header(progress=10) + b"".join(
        rc_crafted(0, 0x11, psn_sel=2, delta=d, syndrome=s)
        for d, s in ((0, 0x1F), (1, 0x2C), (0, 0x60), (2, 0x40), (0, 0x61), (0, 0x9F)))
    requests = rc_header(progress=0) + b"".join([
        rc_crafted(1, 0x0A, plen=64, va_off=0x100),  # WRITE Only into B's live region
        rc_crafted(1, 0x0C, plen=0, va_off=0),  # READ request (length 0)
        rc_crafted(1, 0x00, plen=255),  # SEND First, short: invalid
        rc_crafted(1, 0x0A, plen=16, rsel=2),  # WRITE into the no-remote region
        rc_crafted(1, 0x04, psn_sel=0, delta=5, plen=8),  # ahead: sequence NAK
        rc_crafted(1, 0x04, psn_sel=0, delta=-3, plen=8),  # behind: duplicate
        rc_crafted(1, 0x13, plen=0),  # CmpSwap: not offered
    ]) + jump(0x50) + poll(0) + poll(1)
    mutate = rc_header() + jump(0x20) + b"".join(
        bytes([rc_op(4, s), 0, k, b]) + bytes(12) for s, k, b in ((0, 3, 2), (1, 9, 0x23), (0, 1, 5), (1, 20, 0x0B)))
    lifecycle = (rc_header() + life(0, 5 | 8) + jump(0x45) + life(1, 6) + life(0, 0) + jump(0x10)
                 + life(1, 2) + jump(0x10) + life(0, 3) + life(1, 4) + jump(0xC2) + poll(0) + poll(1))
    # First PSN just before the wrap, window 4, READs limited to 1.
    wrap = rc_header(c2=0x41, sizes=(4096, 4096, 4096, 1, 0, 4096)) + jump(0xC5) + poll(0) + poll(1)
    return {"clean": clean, "acks": acks, "requests": requests, "mutate": mutate,
            "lifecycle": lifecycle, "wrap": wrap}


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    fr = frames()
    roce = roce_payloads()
    # ethernet: [fix][u16 len][frame]...
    write("ethernet", "all", bytes([3]) + b"".join(struct.pack("!H", len(f)) + f for f in fr))
    for i, f in enumerate(fr):
        write("ethernet", "frame%d" % i, bytes([2]) + struct.pack("!H", len(f)) + f)
    # arp: [ctl][chunk]...
    write("arp", "request", bytes([0]) + chunk(arp()))
    write("arp", "reply_pending", bytes([2]) + chunk(arp(2, bytes([10, 0, 0, 3]))) + bytes([0x81]) + chunk(arp(1, PEER, PEER)))
    write("arp", "conflict", bytes([1]) + chunk(arp(1, US, US)))
    # ipv4 structured: [ctl even][flags][u16 offset][ttl][opts chunk][payload chunk]
    u = udp(7, b"\xab" * 32)
    write("ipv4", "frags",
          bytes([0, 0x48 | 1]) + struct.pack("!H", 0) + b"\x40" + chunk(b"") + chunk(u[:16])
          + bytes([4, 0x40 | 1]) + struct.pack("!H", 16) + b"\x40" + chunk(b"") + chunk(u[16:]))
    write("ipv4", "overlap",
          bytes([0, 0x48]) + struct.pack("!H", 0) + b"\x40" + chunk(b"") + chunk(b"\0" * 24)
          + bytes([0, 0x48]) + struct.pack("!H", 8) + b"\x40" + chunk(b"") + chunk(b"\1" * 24))
    write("ipv4", "options", bytes([0, 0x04]) + b"\0\0\x40" + chunk(b"\x07\x07\x04\0\0\0\0\0\x01\0") + chunk(icmp_echo()))
    write("ipv4", "raw", bytes([1]) + chunk(ipv4(1, icmp_echo(data=b"abc"))))
    # icmp / udp: [ctl][chunk]
    write("icmp", "echo", bytes([0]) + chunk(icmp_echo()))
    write("icmp", "reply", bytes([0]) + chunk(icmp_echo(ident=1, seq=1, data=bytes(16), typ=0)))
    quoted = ipv4(1, icmp_echo(data=b""))[:28]
    write("icmp", "unreach", bytes([0]) + chunk(struct.pack("!BBHI", 3, 1, 0, 0) + quoted))
    write("udp", "bound", bytes([0]) + chunk(udp(7, b"hello")))
    write("udp", "unbound", bytes([0]) + chunk(udp(9, b"hello")) + bytes([0]) + chunk(udp(0, b"")))
    if roce:
        write("udp", "roce", bytes([0]) + chunk(udp(4791, roce[0])))
    # tcp: [ctl][ack u32][flags u16][win u16][opts chunk][payload chunk]
    write("tcp", "handshake",
          bytes([0]) + struct.pack("!IHH", 0, 0x02, 65535) + chunk(SYN_OPTS) + chunk(b"")
          + bytes([0x10]) + struct.pack("!IHH", 0, 0x10, 65535) + chunk(bytes([1, 1, 8, 10, 0, 0, 0, 2, 0, 0, 0, 0])) + chunk(b"")
          + bytes([0x10]) + struct.pack("!IHH", 0, 0x18, 65535) + chunk(b"") + chunk(b"data")
          + bytes([0x10]) + struct.pack("!IHH", 0, 0x11, 0) + chunk(b"") + chunk(b""))
    write("tcp", "rst", bytes([0]) + struct.pack("!IHH", 0, 0x04, 0) + chunk(b"") + chunk(b""))
    # roce: [ctl][chunk]; the capture's packets (ICRC repaired on our headers).
    for i, p in enumerate(roce[:4]):
        write("roce", "rnic%d" % i, bytes([0x80]) + chunk(p))
        write("roundtrip", "roce%d" % i, bytes([0]) + p)
    # iperf_json: framed parameter JSON, as iperf3 3.12 sends it.
    params = json.dumps({"tcp": True, "omit": 0, "time": 10, "num": 0, "blockcount": 0,
                         "parallel": 1, "len": 131072, "pacing_timer": 1000,
                         "client_version": "3.12"}).encode()
    write("iperf_json", "params", struct.pack("!I", len(params)) + params)
    write("iperf_json", "reverse", b'{"tcp":true,"time":2,"parallel":4,"reverse":true,"len":1000}')
    # telemetry_line: two snapshot lines (rates between them).
    snap = {"name": "ustack", "pid": 1, "seq": 1, "at_ns": 1000000000,
            "publisher": {"clients": 1, "skipped": 0, "dropped_clients": 0},
            "stack": {"eth": {"rx_frames": 10, "rx_accepted": 9}, "drops": {"ipv4_bad_checksum": 1},
                      "tcp": {"segs_in": 5}},
            "port": {"rx_packets": 10, "rx_bytes": 1000, "tx_packets": 5, "tx_bytes": 500},
            "pools": [{"name": "rx", "capacity": 1024, "in_use": 3, "alloc_failures": 0, "buf_size": 2048}],
            "connections": [{"local": "10.0.0.1:5001", "remote": "10.0.0.2:40000", "state": "Established",
                             "cwnd": 14600, "srtt_us": 120, "mss": 1460, "congestion": "cubic",
                             "stats": {"segs_in": 5, "bytes_in": 100}}],
            "connections_total": 1}
    snap2 = dict(snap, seq=2, at_ns=1250000000, port=dict(snap["port"], rx_packets=30))
    write("telemetry_line", "two", (json.dumps(snap) + "\n" + json.dumps(snap2) + "\n").encode())
    # receive_path: ops (see the target): peer talk, live-tuple segments, mutated templates.
    write("receive_path", "talk", bytes([5, 3, 10, 4, 0, 5]))
    write("receive_path", "inject",
          bytes([2]) + struct.pack("!hhH", 0, 0, 0x04) + b"\0\0" + chunk(b"") + chunk(b"")
          + bytes([2 | 8]) + struct.pack("!hhH", 100, 0, 0x02) + b"\0\0" + chunk(SYN_OPTS) + chunk(b"")
          + bytes([0x82]) + struct.pack("!hhH", 0, 0, 0x10) + b"\0" + chunk(b"") + chunk(b"x" * 10)
          + bytes([3, 200]))
    write("receive_path", "mutate", bytes([1, 3, 2, 0, 40, 0xff, 0, 50, 0x01, 3, 5, 0x81, 1, 1, 0, 20, 0x10]))
    # roundtrip: [0] RoCE payload, [1] TCP segment, [2] IPv4 packet.
    write("roundtrip", "tcp_syn", bytes([1]) + tcp(5001, 1000, 0, 0x02, SYN_OPTS))
    write("roundtrip", "tcp_sack", bytes([1]) + tcp(5001, 1000, 5, 0x10, bytes([1, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 9])))
    write("roundtrip", "ipv4", bytes([2]) + ipv4(17, udp(7, b"hi")))
    # rc: config, initial work, then ops (see fuzz_targets/rc.rs).
    for name, data in rc_seeds().items():
        write("rc", name, data)


if __name__ == "__main__":
    main()
