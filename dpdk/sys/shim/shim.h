/* ustack's C shim over DPDK 22.11: the static inline fast-path functions
 * (which bindgen cannot link against) as real symbols, plus a few accessors
 * that keep struct layouts (rte_mbuf, rte_eth_link bitfields, the packed
 * rte_ether_addr) out of the Rust bindings. */
#ifndef USTACK_DPDK_SHIM_H
#define USTACK_DPDK_SHIM_H

#include <stdint.h>
#include <rte_config.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_log.h>
#include <rte_lcore.h>
#include <rte_mempool.h>
#include <rte_mbuf.h>
#include <rte_ethdev.h>

/* rte_errno is a per-lcore (thread-local) variable. */
int ustack_errno(void);

uint16_t ustack_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);
uint16_t ustack_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);

struct rte_mbuf *ustack_pktmbuf_alloc(struct rte_mempool *mp);
void ustack_pktmbuf_free(struct rte_mbuf *m);
/* Free `n` mbufs in one call (rte_pktmbuf_free_bulk). */
void ustack_pktmbuf_free_bulk(struct rte_mbuf **pkts, unsigned int n);

/* The frame: rte_pktmbuf_mtod and data_len of the first segment. */
uint8_t *ustack_mbuf_data(struct rte_mbuf *m);
uint16_t ustack_mbuf_data_len(const struct rte_mbuf *m);
uint32_t ustack_mbuf_pkt_len(const struct rte_mbuf *m);
uint16_t ustack_mbuf_nb_segs(const struct rte_mbuf *m);
/* Room after data_off in the first segment (headroom excluded). */
uint16_t ustack_mbuf_room(const struct rte_mbuf *m);
uint16_t ustack_mbuf_headroom(const struct rte_mbuf *m);
/* Set a single-segment mbuf's length (data_len = pkt_len = len); -1 if it does not fit. */
int ustack_mbuf_set_len(struct rte_mbuf *m, uint16_t len);
/* rte_pktmbuf_append / rte_pktmbuf_prepend: NULL when there is no room. */
uint8_t *ustack_mbuf_append(struct rte_mbuf *m, uint16_t len);
uint8_t *ustack_mbuf_prepend(struct rte_mbuf *m, uint16_t len);
/* Transmit checksum offload request (RTE_MBUF_F_TX_IPV4 | IP_CKSUM | L4 kind). */
void ustack_mbuf_tx_offload(struct rte_mbuf *m, uint64_t flags, uint16_t l2_len, uint16_t l3_len,
			    uint16_t l4_len, uint16_t tso_segsz);
uint64_t ustack_mbuf_ol_flags(const struct rte_mbuf *m);
/* Lower a TSO frame's segment size so each frame cut from it, headers
 * included, is at most `max_frame` bytes (no-op for other frames). */
void ustack_mbuf_clamp_tso_frame(struct rte_mbuf *m, uint16_t max_frame);

/* Link state without the bitfields. */
int ustack_link_get(uint16_t port, uint32_t *speed_mbps, int *up, int *full_duplex);
/* The port's MAC into out[6]. */
int ustack_macaddr_get(uint16_t port, uint8_t out[6]);

#endif
