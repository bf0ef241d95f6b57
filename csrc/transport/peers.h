/* Open connections per peer address, shared by a server's loop threads, so that one address
 * cannot take every connection slot. Accepting is not a hot path: one mutex guards the table. */
#ifndef OI_TRANSPORT_PEERS_H
#define OI_TRANSPORT_PEERS_H

#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>

#define OI_PEERS_BUCKETS 1024

/* A peer's address: 16 bytes, IPv4 as its IPv4-mapped IPv6 form so that one host counts once
 * whichever family it used. */
typedef struct oi_peer_addr_s {
    uint8_t bytes[16];
} oi_peer_addr_t;

typedef struct oi_peers_s {
    pthread_mutex_t mu;
    int limit; /* connections one address may hold; <= 0: no limit */
    struct oi_peer_node_s *buckets[OI_PEERS_BUCKETS];
} oi_peers_t;

void oi_peers_init(oi_peers_t *p, int limit);

/* Frees every entry (no connection may be counted any more). */
void oi_peers_destroy(oi_peers_t *p);

/* Reads the peer address of a connected socket into `out`. 0, or -1 when the socket has no
 * IP peer (then the connection is not counted). */
int oi_peer_addr_of(int fd, oi_peer_addr_t *out);

/* Counts one more connection from `a`: 0, or -1 when the address already holds `limit`
 * connections (then nothing is counted) or the table is out of memory. Each 0 must be matched
 * by one oi_peers_release. */
int oi_peers_acquire(oi_peers_t *p, const oi_peer_addr_t *a);

void oi_peers_release(oi_peers_t *p, const oi_peer_addr_t *a);

#endif
