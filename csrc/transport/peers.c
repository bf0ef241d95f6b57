#include "transport/peers.h"

#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

typedef struct oi_peer_node_s {
    struct oi_peer_node_s *next;
    oi_peer_addr_t addr;
    int count;
} peer_node_t;

void oi_peers_init(oi_peers_t *p, int limit)
{
    memset(p, 0, sizeof(*p));
    pthread_mutex_init(&p->mu, NULL);
    p->limit = limit;
}

void oi_peers_destroy(oi_peers_t *p)
{
    for (int i = 0; i < OI_PEERS_BUCKETS; i++) {
        for (peer_node_t *n = p->buckets[i], *next; n != NULL; n = next) {
            next = n->next;
            free(n);
        }
        p->buckets[i] = NULL;
    }
    pthread_mutex_destroy(&p->mu);
}

int oi_peer_addr_of(int fd, oi_peer_addr_t *out)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    const struct sockaddr *sa = (const struct sockaddr *)&ss;
    memset(out, 0, sizeof(*out));
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0)
        return -1;
    if (sa->sa_family == AF_INET) {
        out->bytes[10] = out->bytes[11] = 0xff;
        memcpy(out->bytes + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        return 0;
    }
    if (sa->sa_family == AF_INET6) {
        memcpy(out->bytes, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        return 0;
    }
    return -1;
}

/* FNV-1a: the keys are addresses a client picks, but a bucket's chain is only ever as long as
 * the number of distinct peers that land in it, each bounded by the connection limit. */
static unsigned bucket_of(const oi_peer_addr_t *a)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < 16; i++)
        h = (h ^ a->bytes[i]) * 16777619u;
    return h % OI_PEERS_BUCKETS;
}

int oi_peers_acquire(oi_peers_t *p, const oi_peer_addr_t *a)
{
    unsigned b = bucket_of(a);
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    peer_node_t *n = p->buckets[b];
    while (n != NULL && memcmp(&n->addr, a, sizeof(*a)) != 0)
        n = n->next;
    if (n == NULL) {
        n = calloc(1, sizeof(*n));
        if (n == NULL) {
            rc = -1;
            goto out;
        }
        n->addr = *a;
        n->next = p->buckets[b];
        p->buckets[b] = n;
    }
    if (p->limit > 0 && n->count >= p->limit)
        rc = -1;
    else
        n->count++;
out:
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void oi_peers_release(oi_peers_t *p, const oi_peer_addr_t *a)
{
    unsigned b = bucket_of(a);
    pthread_mutex_lock(&p->mu);
    for (peer_node_t **pn = &p->buckets[b]; *pn != NULL; pn = &(*pn)->next) {
        peer_node_t *n = *pn;
        if (memcmp(&n->addr, a, sizeof(*a)) == 0) {
            if (--n->count == 0) { /* a peer with no connection takes no memory */
                *pn = n->next;
                free(n);
            }
            break;
        }
    }
    pthread_mutex_unlock(&p->mu);
}
