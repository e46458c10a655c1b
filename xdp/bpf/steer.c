// SPDX-License-Identifier: MIT OR Apache-2.0
//
// ustack's XDP program: frames for the stack go to its AF_XDP socket, every
// other frame to the kernel (XDP_PASS), so the kernel keeps the interface
// (ssh to the host's own address keeps working).
//
// Frames for the stack are:
//   - unicast to the stack's own MAC (`station`, flag OWN_MAC), or, when the
//     stack shares the interface's MAC, unicast IPv4/IPv6/ARP whose
//     destination (ARP: target) address is one of the stack's (`ours`);
//   - broadcast ARP whose target address is one of the stack's;
//   - multicast ICMPv6 neighbor solicitations and advertisements whose
//     target is one of the stack's.
// Addresses are keyed as 16 bytes: IPv6 as they are, IPv4 v4-mapped.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define ETH_HLEN 14
#define OWN_MAC 1ULL

struct addr16 {
	__u8 b[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 64);
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct addr16);
	__type(value, __u8);
	__uint(max_entries, 64);
} ours SEC(".maps");

// Index 0: the stack's MAC in bytes 0..6 of the value (wire order) and the
// flags in byte 7.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} station SEC(".maps");

static __always_inline int to_stack(struct xdp_md *ctx)
{
	return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
}

static __always_inline int ours_v4(const __u8 *a)
{
	struct addr16 key = {};
	key.b[10] = 0xff;
	key.b[11] = 0xff;
	__builtin_memcpy(&key.b[12], a, 4);
	return bpf_map_lookup_elem(&ours, &key) != 0;
}

static __always_inline int ours_v6(const __u8 *a)
{
	struct addr16 key;
	__builtin_memcpy(key.b, a, 16);
	return bpf_map_lookup_elem(&ours, &key) != 0;
}

SEC("xdp")
int steer(struct xdp_md *ctx)
{
	const __u8 *data = (const __u8 *)(long)ctx->data;
	const __u8 *end = (const __u8 *)(long)ctx->data_end;
	__u32 zero = 0;
	const __u8 *st;
	__u16 proto;

	if (data + ETH_HLEN > end)
		return XDP_PASS;
	st = bpf_map_lookup_elem(&station, &zero);
	if (!st)
		return XDP_PASS;
	proto = ((__u16)data[12] << 8) | data[13];

	if (!(data[0] & 1)) {
		// Unicast: ours by MAC when the stack has a MAC of its own.
		if (data[0] != st[0] || data[1] != st[1] || data[2] != st[2] ||
		    data[3] != st[3] || data[4] != st[4] || data[5] != st[5])
			return XDP_PASS;
		if (st[7] & OWN_MAC)
			return to_stack(ctx);
		// Shared MAC: by the destination address.
		if (proto == 0x0800) {
			if (data + ETH_HLEN + 20 > end)
				return XDP_PASS;
			return ours_v4(data + ETH_HLEN + 16) ? to_stack(ctx) : XDP_PASS;
		}
		if (proto == 0x86DD) {
			if (data + ETH_HLEN + 40 > end)
				return XDP_PASS;
			return ours_v6(data + ETH_HLEN + 24) ? to_stack(ctx) : XDP_PASS;
		}
		if (proto == 0x0806) {
			if (data + ETH_HLEN + 28 > end)
				return XDP_PASS;
			return ours_v4(data + ETH_HLEN + 24) ? to_stack(ctx) : XDP_PASS;
		}
		return XDP_PASS;
	}

	// Broadcast and multicast: ARP and neighbor discovery about our
	// addresses only.
	if (proto == 0x0806) {
		if (data + ETH_HLEN + 28 > end)
			return XDP_PASS;
		return ours_v4(data + ETH_HLEN + 24) ? to_stack(ctx) : XDP_PASS;
	}
	if (proto == 0x86DD) {
		// IPv6 header, then ICMPv6 type 135/136 with the target at 8.
		if (data + ETH_HLEN + 40 + 24 > end)
			return XDP_PASS;
		if (data[ETH_HLEN + 6] != 58)
			return XDP_PASS;
		if (data[ETH_HLEN + 40] != 135 && data[ETH_HLEN + 40] != 136)
			return XDP_PASS;
		return ours_v6(data + ETH_HLEN + 48) ? to_stack(ctx) : XDP_PASS;
	}
	return XDP_PASS;
}

char _license[] SEC("license") = "Dual MIT/GPL";
