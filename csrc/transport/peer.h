/* Who is on the other end of a connection: the user and groups of the process that owns the
 * client's socket, for deciding what the server may do on that client's behalf (shared
 * memory it names, files it sends). The server often runs as root beside other users'
 * processes, so its own rights are never the measure. */
#ifndef OI_TRANSPORT_PEER_H
#define OI_TRANSPORT_PEER_H

#include <sys/types.h>

/* Supplementary groups kept per peer; more are ignored (access through them is refused). */
#define OI_PEER_MAX_GROUPS 64

typedef struct oi_peer_s {
    int error; /* 0: the fields below are the client's; else an errno saying why unknown */
    uid_t uid;
    gid_t gid;   /* primary group; (gid_t)-1 when unknown */
    int ngroups; /* supplementary groups in `groups` */
    gid_t groups[OI_PEER_MAX_GROUPS];
} oi_peer_t;

/* Fills *out for the connected socket `fd`. A Unix-domain peer gives its credentials
 * (SO_PEERCRED, SO_PEERGROUPS). A TCP peer on this host is found through sock_diag by the
 * connection's addresses: the owner of its socket, with that user's groups from the user
 * database. A peer on another host (or in another network namespace) is unknown: out->error
 * is ENOENT. Blocking but short (a netlink round trip, and for TCP a user-database look-up):
 * call it once per connection, when first needed. */
void oi_peer_lookup(int fd, oi_peer_t *out);

/* The peer of `fd`, looked up on the first call and kept in *cache (freed by the caller with
 * free()); an unknown peer with ENOMEM when out of memory. */
const oi_peer_t *oi_peer_cached(oi_peer_t **cache, int fd);

/* Whether a known peer belongs to group `g` (primary or supplementary). */
int oi_peer_in_group(const oi_peer_t *p, gid_t g);

#endif
