/* outwatch: the outgoing Raft connections raft_uv holds, watched for a peer that closed its
 * end (transport.h, transport_dead_outgoing). */
#include "transport.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "clog.h"

/* The inode of the socket fd names, 0 when fd names nothing. */
static uint64_t socketIno(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) ? (uint64_t)st.st_ino : 0;
}

void transport_watch(struct transport *t, raft_id peer, uv_stream_t *stream)
{
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)stream, &fd) != 0) {
        return;
    }
    uint64_t ino = socketIno(fd);
    if (ino == 0) {
        return;
    }
    struct transport_watched *slot = NULL;
    for (size_t i = 0; i < TRANSPORT_WATCHED_MAX; i++) {
        struct transport_watched *w = &t->watched[i];
        if (w->fd >= 0 && w->peer == peer) {
            slot = w; /* the peer's earlier connection: raft_uv replaced it */
            break;
        }
        if (w->fd < 0 && slot == NULL) {
            slot = w;
        }
    }
    if (slot == NULL) {
        return; /* more peers than a cluster has members: not watched */
    }
    *slot = (struct transport_watched){.fd = fd, .ino = ino, .peer = peer};
}

/* Whether the connection on fd was closed by its peer (end of stream or reset), read
 * without taking anything from it. */
static bool peerClosed(int fd)
{
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) {
        return true;
    }
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

size_t transport_dead_outgoing(struct transport *t, raft_id *ids, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < TRANSPORT_WATCHED_MAX && n < cap; i++) {
        struct transport_watched *w = &t->watched[i];
        if (w->fd < 0) {
            continue;
        }
        if (socketIno(w->fd) != w->ino) {
            w->fd = -1; /* raft_uv closed it (and the number may name another file now) */
            continue;
        }
        if (!peerClosed(w->fd)) {
            continue;
        }
        clog_info("node %llu closed this node's Raft connection to it: connecting again",
                  (unsigned long long)w->peer);
        shutdown(w->fd, SHUT_WR);
        ids[n++] = w->peer;
        w->fd = -1;
    }
    return n;
}
