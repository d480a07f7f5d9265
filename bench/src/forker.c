/* The benchmarks' process maker, small so that 100k of its children fit in memory.
 *   forker fan N [UID]
 *                     fork N children that pause(); then, given UID, become that user (the
 *                     children stay root's: a user may be limited to fewer processes than N);
 *                     print "ready"; wait for stdin to close
 *   forker storm SECS WORKERS
 *                     WORKERS processes each fork+exit+wait as fast as they can for SECS
 *                     seconds; print the total count */
#define _GNU_SOURCE
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: forker fan N [UID] | forker storm SECONDS WORKERS\n");
        return 2;
    }
    long n = atol(argv[2]);
    if (strcmp(argv[1], "fan") == 0) {
        for (long i = 0; i < n; i++) {
            pid_t pid = fork();
            if (pid < 0) { perror("fork"); return 1; }
            /* The children let go of stdout: the reader sees its end when the parent exits. */
            if (pid == 0) { close(1); for (;;) pause(); }
        }
        if (argc > 3) {
            uid_t uid = (uid_t)atol(argv[3]);
            if (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 ||
                setresuid(uid, uid, uid) < 0) {
                perror("becoming the user");
                return 1;
            }
        }
        printf("ready\n");
        fflush(stdout);
        char buf[1];
        while (read(0, buf, 1) > 0) {}
        return 0;
    }
    if (strcmp(argv[1], "storm") == 0 && argc == 4) {
        long workers = atol(argv[3]);
        double end = now() + n;
        int counts[2];
        if (pipe(counts) < 0) { perror("pipe"); return 1; }
        for (long w = 0; w < workers; w++) {
            pid_t worker = fork();
            if (worker < 0) { perror("fork"); return 1; }
            if (worker > 0) continue;
            long forks = 0;
            while (now() < end) {
                pid_t pid = fork();
                if (pid < 0) { perror("fork"); _exit(1); }
                if (pid == 0) _exit(0);
                waitpid(pid, NULL, 0);
                forks++;
            }
            /* One small write: atomic on a pipe, whatever the other workers do. */
            if (write(counts[1], &forks, sizeof forks) != sizeof forks) _exit(1);
            _exit(0);
        }
        close(counts[1]);
        long total = 0, forks;
        while (read(counts[0], &forks, sizeof forks) == sizeof forks) total += forks;
        while (wait(NULL) > 0) {}
        printf("%ld\n", total);
        return 0;
    }
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
}
