/* The floor of a request and its answer over a unix socket: one thread, one epoll loop,
 * every byte read written straight back. Built by bench/harness/echo.py with the
 * machine's C compiler; nothing here is eventspool's.
 *
 * usage: echo_server PATH    listens on PATH, prints "ready", runs until killed. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static char buffer[262144];

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH\n", argv[0]);
        return 2;
    }
    int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    strncpy(address.sun_path, argv[1], sizeof address.sun_path - 1);
    unlink(argv[1]);
    if (bind(listener, (struct sockaddr *)&address, sizeof address) || listen(listener, 4096)) {
        perror("bind/listen");
        return 1;
    }
    int loop = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event event = {.events = EPOLLIN, .data.fd = listener};
    epoll_ctl(loop, EPOLL_CTL_ADD, listener, &event);
    printf("ready\n");
    fflush(stdout);
    struct epoll_event ready[256];
    for (;;) {
        int count = epoll_wait(loop, ready, 256, -1);
        if (count < 0) {
            if (errno == EINTR) continue;
            perror("epoll_wait");
            return 1;
        }
        for (int i = 0; i < count; i++) {
            int fd = ready[i].data.fd;
            if (fd == listener) {
                int peer;
                while ((peer = accept4(listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    struct epoll_event readable = {.events = EPOLLIN, .data.fd = peer};
                    epoll_ctl(loop, EPOLL_CTL_ADD, peer, &readable);
                }
                continue;
            }
            ssize_t got = read(fd, buffer, sizeof buffer);
            if (got < 0 && errno == EAGAIN) continue;
            if (got <= 0) {
                close(fd); /* also leaves the epoll set */
                continue;
            }
            /* An echo is as small as its request: the socket buffer takes it at once, and
             * a short write is retried on the spot rather than queued. */
            for (ssize_t done = 0; done < got;) {
                ssize_t wrote = write(fd, buffer + done, got - done);
                if (wrote >= 0) done += wrote;
                else if (errno != EAGAIN) break;
            }
        }
    }
}
