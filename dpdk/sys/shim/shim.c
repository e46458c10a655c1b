/* See shim.h. Every function is a thin call of one DPDK inline. */
#include "shim.h"

int ustack_errno(void) { return rte_errno; }

uint16_t ustack_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n)
{
	return rte_eth_rx_burst(port, queue, pkts, n);
}

uint16_t ustack_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n)
{
	return rte_eth_tx_burst(port, queue, pkts, n);
}

struct rte_mbuf *ustack_pktmbuf_alloc(struct rte_mempool *mp) { return rte_pktmbuf_alloc(mp); }

void ustack_pktmbuf_free(struct rte_mbuf *m) { rte_pktmbuf_free(m); }

void ustack_pktmbuf_free_bulk(struct rte_mbuf **pkts, unsigned int n) { rte_pktmbuf_free_bulk(pkts, n); }

uint8_t *ustack_mbuf_data(struct rte_mbuf *m) { return rte_pktmbuf_mtod(m, uint8_t *); }

uint16_t ustack_mbuf_data_len(const struct rte_mbuf *m) { return m->data_len; }

uint32_t ustack_mbuf_pkt_len(const struct rte_mbuf *m) { return m->pkt_len; }

uint16_t ustack_mbuf_nb_segs(const struct rte_mbuf *m) { return m->nb_segs; }

uint16_t ustack_mbuf_room(const struct rte_mbuf *m) { return (uint16_t)(m->buf_len - m->data_off); }

uint16_t ustack_mbuf_headroom(const struct rte_mbuf *m) { return rte_pktmbuf_headroom(m); }

int ustack_mbuf_set_len(struct rte_mbuf *m, uint16_t len)
{
	if (m->nb_segs != 1 || len > m->buf_len - m->data_off)
		return -1;
	m->data_len = len;
	m->pkt_len = len;
	return 0;
}

uint8_t *ustack_mbuf_append(struct rte_mbuf *m, uint16_t len) { return (uint8_t *)rte_pktmbuf_append(m, len); }

uint8_t *ustack_mbuf_prepend(struct rte_mbuf *m, uint16_t len) { return (uint8_t *)rte_pktmbuf_prepend(m, len); }

void ustack_mbuf_tx_offload(struct rte_mbuf *m, uint64_t flags, uint16_t l2_len, uint16_t l3_len,
			    uint16_t l4_len, uint16_t tso_segsz)
{
	m->ol_flags |= flags;
	m->l2_len = l2_len;
	m->l3_len = l3_len;
	m->l4_len = l4_len;
	m->tso_segsz = tso_segsz;
}

uint64_t ustack_mbuf_ol_flags(const struct rte_mbuf *m) { return m->ol_flags; }

void ustack_mbuf_clamp_tso_frame(struct rte_mbuf *m, uint16_t max_frame)
{
	uint32_t headers = (uint32_t)m->l2_len + m->l3_len + m->l4_len;

	if (!(m->ol_flags & RTE_MBUF_F_TX_TCP_SEG) || headers >= max_frame)
		return;
	if (m->tso_segsz + headers > max_frame)
		m->tso_segsz = (uint16_t)(max_frame - headers);
}

int ustack_link_get(uint16_t port, uint32_t *speed_mbps, int *up, int *full_duplex)
{
	struct rte_eth_link link;
	int rc = rte_eth_link_get_nowait(port, &link);
	if (rc != 0)
		return rc;
	*speed_mbps = link.link_speed;
	*up = link.link_status == RTE_ETH_LINK_UP;
	*full_duplex = link.link_duplex == RTE_ETH_LINK_FULL_DUPLEX;
	return 0;
}

int ustack_macaddr_get(uint16_t port, uint8_t out[6])
{
	struct rte_ether_addr a;
	int rc = rte_eth_macaddr_get(port, &a);
	if (rc != 0)
		return rc;
	for (int i = 0; i < 6; i++)
		out[i] = a.addr_bytes[i];
	return 0;
}

/* The values dpdk-sys hard-codes in `offload` (bindgen cannot evaluate RTE_BIT64). */
_Static_assert(RTE_ETH_TX_OFFLOAD_IPV4_CKSUM == (1ULL << 1), "tx ipv4 cksum");
_Static_assert(RTE_ETH_TX_OFFLOAD_UDP_CKSUM == (1ULL << 2), "tx udp cksum");
_Static_assert(RTE_ETH_TX_OFFLOAD_TCP_CKSUM == (1ULL << 3), "tx tcp cksum");
_Static_assert(RTE_ETH_TX_OFFLOAD_TCP_TSO == (1ULL << 5), "tx tso");
_Static_assert(RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE == (1ULL << 16), "mbuf fast free");
_Static_assert(RTE_MBUF_F_RX_L4_CKSUM_BAD == (1ULL << 3), "mbuf rx l4 bad");
_Static_assert(RTE_MBUF_F_RX_L4_CKSUM_GOOD == (1ULL << 8), "mbuf rx l4 good");
_Static_assert(RTE_ETH_RX_OFFLOAD_IPV4_CKSUM == (1ULL << 1), "rx ipv4 cksum");
_Static_assert(RTE_ETH_RX_OFFLOAD_UDP_CKSUM == (1ULL << 2), "rx udp cksum");
_Static_assert(RTE_ETH_RX_OFFLOAD_TCP_CKSUM == (1ULL << 3), "rx tcp cksum");
_Static_assert(RTE_MBUF_F_TX_TCP_SEG == (1ULL << 50), "mbuf tx tso");
_Static_assert(RTE_MBUF_F_TX_TCP_CKSUM == (1ULL << 52), "mbuf tx tcp");
_Static_assert(RTE_MBUF_F_TX_UDP_CKSUM == (3ULL << 52), "mbuf tx udp");
_Static_assert(RTE_MBUF_F_TX_IP_CKSUM == (1ULL << 54), "mbuf tx ip");
_Static_assert(RTE_MBUF_F_TX_IPV4 == (1ULL << 55), "mbuf tx ipv4");
_Static_assert(RTE_ETH_RSS_IPV4 == (1ULL << 2), "rss ipv4");
_Static_assert(RTE_ETH_RSS_FRAG_IPV4 == (1ULL << 3), "rss frag ipv4");
_Static_assert(RTE_ETH_RSS_NONFRAG_IPV4_TCP == (1ULL << 4), "rss ipv4 tcp");
_Static_assert(RTE_ETH_RSS_NONFRAG_IPV4_OTHER == (1ULL << 7), "rss ipv4 other");
