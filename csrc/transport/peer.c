#include "transport/peer.h"

#include <errno.h>
#include <grp.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <pwd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The user database's groups of `uid` (its primary group and supplementary ones), as the
 * kernel would give a process of that user that logged in. */
static void groups_of_user(oi_peer_t *p)
{
    char stack[4096];
    struct passwd pw, *found = NULL;
    if (getpwuid_r(p->uid, &pw, stack, sizeof(stack), &found) != 0 || found == NULL)
        return; /* no entry: owner and "other" permission bits only */
    p->gid = pw.pw_gid;
    int n = OI_PEER_MAX_GROUPS;
    if (getgrouplist(pw.pw_name, pw.pw_gid, p->groups, &n) < 0)
        n = OI_PEER_MAX_GROUPS; /* more than we keep: the first ones */
    p->ngroups = n;
}

static void unix_peer(int fd, oi_peer_t *p)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        p->error = errno;
        return;
    }
    p->uid = cred.uid;
    p->gid = cred.gid;
#ifdef SO_PEERGROUPS
    len = sizeof(p->groups);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, p->groups, &len) == 0)
        p->ngroups = (int)(len / sizeof(gid_t));
#endif
}

/* Asks sock_diag for the socket whose local end is `peer` and remote end is `local`: the
 * client's own socket, when the client runs on this host. */
static void tcp_peer(int fd, oi_peer_t *p)
{
    struct sockaddr_storage local, peer;
    socklen_t llen = sizeof(local), plen = sizeof(peer);
    if (getsockname(fd, (struct sockaddr *)&local, &llen) != 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &plen) != 0) {
        p->error = errno;
        return;
    }
    struct {
        struct nlmsghdr nlh;
        struct inet_diag_req_v2 req;
    } msg;
    memset(&msg, 0, sizeof(msg));
    msg.nlh.nlmsg_len = sizeof(msg);
    msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    msg.nlh.nlmsg_flags = NLM_F_REQUEST;
    msg.req.sdiag_family = (uint8_t)local.ss_family;
    msg.req.sdiag_protocol = IPPROTO_TCP;
    msg.req.idiag_states = ~0u;
    msg.req.id.idiag_cookie[0] = msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    if (local.ss_family == AF_INET) {
        const struct sockaddr_in *l = (const void *)&local, *r = (const void *)&peer;
        msg.req.id.idiag_sport = r->sin_port;
        msg.req.id.idiag_dport = l->sin_port;
        memcpy(msg.req.id.idiag_src, &r->sin_addr, 4);
        memcpy(msg.req.id.idiag_dst, &l->sin_addr, 4);
    } else { /* AF_INET6; the kernel looks IPv4-mapped addresses up among IPv4 sockets */
        const struct sockaddr_in6 *l = (const void *)&local, *r = (const void *)&peer;
        msg.req.id.idiag_sport = r->sin6_port;
        msg.req.id.idiag_dport = l->sin6_port;
        memcpy(msg.req.id.idiag_src, &r->sin6_addr, 16);
        memcpy(msg.req.id.idiag_dst, &l->sin6_addr, 16);
    }
    int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (nl < 0) {
        p->error = errno;
        return;
    }
    union {
        struct nlmsghdr nlh;
        char bytes[1024];
    } reply;
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    ssize_t n = -1;
    if (sendto(nl, &msg, sizeof(msg), 0, (struct sockaddr *)&kernel, sizeof(kernel)) == (ssize_t)sizeof(msg)) {
        do
            n = recv(nl, &reply, sizeof(reply), 0);
        while (n < 0 && errno == EINTR);
    }
    p->error = n < 0 ? errno : 0;
    close(nl);
    if (n < 0)
        return;
    const struct nlmsghdr *h = &reply.nlh;
    if (!NLMSG_OK(h, (size_t)n) || h->nlmsg_type == NLMSG_ERROR || h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
        NLMSG_PAYLOAD(h, 0) < sizeof(struct inet_diag_msg)) {
        const struct nlmsgerr *e = NLMSG_OK(h, (size_t)n) && h->nlmsg_type == NLMSG_ERROR ? NLMSG_DATA(h) : NULL;
        p->error = e != NULL && e->error < 0 ? -e->error : ENOENT; /* not a socket of this host */
        return;
    }
    const struct inet_diag_msg *m = NLMSG_DATA(h);
    p->uid = m->idiag_uid;
    groups_of_user(p);
}

void oi_peer_lookup(int fd, oi_peer_t *out)
{
    memset(out, 0, sizeof(*out));
    out->gid = (gid_t)-1;
    struct sockaddr_storage local;
    socklen_t len = sizeof(local);
    if (getsockname(fd, (struct sockaddr *)&local, &len) != 0)
        out->error = errno;
    else if (local.ss_family == AF_UNIX)
        unix_peer(fd, out);
    else if (local.ss_family == AF_INET || local.ss_family == AF_INET6)
        tcp_peer(fd, out);
    else
        out->error = EAFNOSUPPORT;
}

const oi_peer_t *oi_peer_cached(oi_peer_t **cache, int fd)
{
    static const oi_peer_t no_memory = {.error = ENOMEM};
    if (*cache == NULL) {
        if ((*cache = malloc(sizeof(**cache))) == NULL)
            return &no_memory;
        oi_peer_lookup(fd, *cache);
    }
    return *cache;
}

int oi_peer_in_group(const oi_peer_t *p, gid_t g)
{
    if (p->gid == g)
        return 1;
    for (int i = 0; i < p->ngroups; i++)
        if (p->groups[i] == g)
            return 1;
    return 0;
}
