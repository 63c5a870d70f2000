/* The floor of a request and its answer over a unix socket: one thread, one epoll loop,
 * every byte read written straight back. Built by bench/harness/echo.py with the
 * machine's C compiler; nothing here is eventspool's.
 *
 * usage: echo_server PATH [BUSY_POLL_US]
 *   listens on PATH, prints "ready", runs until killed. With BUSY_POLL_US, each wait
 *   tries epoll without waiting, yielding the CPU between tries, for that many
 *   microseconds before it blocks: the floor of a round trip whose ends do not block
 *   while answers and requests follow each other within that time. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static char buffer[262144];

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* epoll_wait, tried without waiting for `poll_us` first. */
static int wait_ready(int loop, struct epoll_event *ready, int size, double poll_us) {
    if (poll_us > 0) {
        double until = now_us() + poll_us;
        for (;;) {
            int count = epoll_wait(loop, ready, size, 0);
            if (count != 0) return count;
            if (now_us() >= until) break;
            sched_yield();
        }
    }
    return epoll_wait(loop, ready, size, -1);
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s PATH [BUSY_POLL_US]\n", argv[0]);
        return 2;
    }
    double poll_us = 0;
    if (argc == 3) {
        char *end;
        poll_us = strtod(argv[2], &end);
        if (end == argv[2] || *end != '\0' || poll_us < 0) {
            fprintf(stderr, "%s: BUSY_POLL_US must be a number of microseconds, not %s\n",
                    argv[0], argv[2]);
            return 2;
        }
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
        int count = wait_ready(loop, ready, 256, poll_us);
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
