#!/usr/bin/env python3
"""Recompute the ICRC of every RoCEv2 frame in a pcap file, independently of
ustack's own code: CRC-32 (zlib) over 8 bytes of 0xFF, then the IPv4 header
with TOS, TTL and header checksum set to all ones (or the IPv6 header with
traffic class, flow label and hop limit set to all ones), the UDP header with its
checksum set to all ones, the BTH with byte 4 (FECN/BECN/reserved) set to all
ones, and the rest of the packet up to the ICRC (InfiniBand spec, annex A17,
"RoCEv2"). The ICRC is the last 4 bytes, least significant byte first.

    tools/roce-icrc.py FILE.pcap [FILE.pcap...]

Prints, per sender address (IPv4 or IPv6), how many frames carry a valid ICRC and how
many do not; exits 1 when any frame is invalid or no RoCEv2 frame was found.
Only the standard library: classic pcap with Ethernet (linktype 1).
"""
import ipaddress
import struct
import sys
import zlib

ROCE_PORT = 4791


def frames(path):
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) < 24:
            raise SystemExit(f"{path}: not a pcap file")
        magic = struct.unpack("<I", head[:4])[0]
        if magic in (0xA1B2C3D4, 0xA1B23C4D):
            endian = "<"
        elif magic in (0xD4C3B2A1, 0x4D3CB2A1):
            endian = ">"
        else:
            raise SystemExit(f"{path}: not a classic pcap file (pcapng?)")
        linktype = struct.unpack(endian + "I", head[20:24])[0]
        if linktype != 1:
            raise SystemExit(f"{path}: linktype {linktype}, only Ethernet (1) is read")
        while True:
            rec = f.read(16)
            if len(rec) < 16:
                return
            _, _, caplen, origlen = struct.unpack(endian + "IIII", rec)
            data = f.read(caplen)
            if caplen == origlen:
                yield data


def roce_icrc(frame):
    """(sender, valid) for a RoCEv2 frame, None for anything else."""
    if len(frame) < 14 + 20 + 8 + 12 + 4:
        return None
    ethertype = struct.unpack("!H", frame[12:14])[0]
    off = 14
    if ethertype == 0x8100:  # one VLAN tag
        ethertype = struct.unpack("!H", frame[16:18])[0]
        off = 18
    ip = frame[off:]
    if ethertype == 0x0800:
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack("!H", ip[2:4])[0]
        if ip[0] >> 4 != 4 or ip[9] != 17 or ihl < 20 or total > len(ip):
            return None
        ip = ip[:total]
        sender = ".".join(str(b) for b in ip[12:16])
        masked_ip = bytearray(ip[:ihl])
        masked_ip[1] = 0xFF  # TOS (DSCP, ECN)
        masked_ip[8] = 0xFF  # TTL
        masked_ip[10:12] = b"\xff\xff"  # header checksum
    elif ethertype == 0x86DD:
        # RoCEv2 over IPv6: UDP right after the fixed header.
        if len(ip) < 40 or ip[0] >> 4 != 6 or ip[6] != 17:
            return None
        ihl = 40
        total = 40 + struct.unpack("!H", ip[4:6])[0]
        if total > len(ip):
            return None
        ip = ip[:total]
        sender = str(ipaddress.IPv6Address(bytes(ip[8:24])))
        masked_ip = bytearray(ip[:40])
        masked_ip[0] |= 0x0F  # traffic class (high nibble)
        masked_ip[1:4] = b"\xff\xff\xff"  # traffic class, flow label
        masked_ip[7] = 0xFF  # hop limit
    else:
        return None
    udp = ip[ihl:]
    if len(udp) < 8 + 12 + 4 or struct.unpack("!H", udp[2:4])[0] != ROCE_PORT:
        return None
    masked_udp = bytearray(udp[:8])
    masked_udp[6:8] = b"\xff\xff"  # UDP checksum
    bth = bytearray(udp[8:20])
    bth[4] = 0xFF  # FECN, BECN, reserved
    rest = udp[20:-4]
    crc = zlib.crc32(b"\xff" * 8 + bytes(masked_ip) + bytes(masked_udp) + bytes(bth) + rest)
    got = struct.unpack("<I", udp[-4:])[0]
    return sender, crc == got


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    seen = {}
    for path in sys.argv[1:]:
        for frame in frames(path):
            r = roce_icrc(frame)
            if r is None:
                continue
            sender, ok = r
            good, bad = seen.get(sender, (0, 0))
            seen[sender] = (good + ok, bad + (not ok))
    if not seen:
        print("no RoCEv2 frames")
        return 1
    for sender, (good, bad) in sorted(seen.items()):
        print(f"{sender}: {good} valid ICRC, {bad} invalid")
    return 1 if any(bad for _, bad in seen.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
