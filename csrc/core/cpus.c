#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_ALLOC */
#endif

#include "core/cpus.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __linux__
#include <sched.h>
#endif

/* Reads a small file into buf (NUL-terminated); 0, or -1 when it cannot be read. */
static int read_small(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return 0;
}

/* ceil(quota / period) as CPUs, or 0 for no limit (or a value that makes no sense). */
static int quota_cpus(long long quota, long long period)
{
    if (quota <= 0 || period <= 0)
        return 0;
    long long n = (quota + period - 1) / period;
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* Reads file `name` of directory `dir` like read_small. */
static int read_in(const char *dir, const char *name, char *buf, size_t cap)
{
    char path[PATH_MAX + 32];
    int n = snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof(path))
        return -1;
    return read_small(path, buf, cap);
}

/* The quota of one cgroup directory; 0 when none or unreadable. */
static int dir_limit(const char *dir, int v2)
{
    char a[64], b[64];
    long long quota, period;
    if (v2) {
        if (read_in(dir, "cpu.max", a, sizeof(a)) != 0 || strncmp(a, "max", 3) == 0)
            return 0;
        if (sscanf(a, "%lld %lld", &quota, &period) != 2)
            return 0;
        return quota_cpus(quota, period);
    }
    if (read_in(dir, "cpu.cfs_quota_us", a, sizeof(a)) != 0 || sscanf(a, "%lld", &quota) != 1 ||
        read_in(dir, "cpu.cfs_period_us", b, sizeof(b)) != 0 || sscanf(b, "%lld", &period) != 1)
        return 0;
    return quota_cpus(quota, period);
}

/* The smallest quota from mount/rel up to mount itself; 0 when none. */
static int walk_up(const char *mount, const char *rel, int v2)
{
    char dir[PATH_MAX];
    int best = 0;
    int n = snprintf(dir, sizeof(dir), "%s%s%s", mount, rel[0] == '/' ? "" : "/", rel);
    if (n < 0 || (size_t)n >= sizeof(dir))
        snprintf(dir, sizeof(dir), "%s", mount);
    size_t floor = strlen(mount);
    for (;;) {
        size_t len = strlen(dir);
        while (len > floor && dir[len - 1] == '/')
            dir[--len] = '\0';
        int lim = dir_limit(dir, v2);
        if (lim > 0 && (best == 0 || lim < best))
            best = lim;
        if (len <= floor)
            return best;
        char *slash = strrchr(dir + floor, '/');
        if (slash == NULL)
            dir[floor] = '\0';
        else
            *slash = '\0';
    }
}

/* 1 when the comma-separated controller list names "cpu". */
static int has_cpu_controller(const char *list, size_t n)
{
    const char *p = list, *end = list + n;
    while (p < end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        size_t len = (size_t)((comma ? comma : end) - p);
        if (len == 3 && memcmp(p, "cpu", 3) == 0)
            return 1;
        p = comma ? comma + 1 : end;
    }
    return 0;
}

int oi_cgroup_cpu_limit(const char *proc_cgroup, const char *root)
{
    char text[4096], mount[PATH_MAX];
    if (read_small(proc_cgroup, text, sizeof(text)) != 0)
        return 0;
    int best = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        /* "hierarchy-ID:controller-list:path"; v2 is "0::path". */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (c2 == NULL)
            continue;
        const char *path = c2 + 1;
        int lim = 0;
        if (c2 == c1 + 1 && strncmp(line, "0:", 2) == 0) {
            lim = walk_up(root, path, 1);
        } else if (has_cpu_controller(c1 + 1, (size_t)(c2 - c1 - 1))) {
            static const char *const names[] = {"cpu", "cpu,cpuacct", "cpuacct,cpu"};
            for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && lim == 0; i++) {
                snprintf(mount, sizeof(mount), "%s/%s", root, names[i]);
                lim = walk_up(mount, path, 0);
            }
        }
        if (lim > 0 && (best == 0 || lim < best))
            best = lim;
    }
    return best;
}

int oi_usable_cpus(void)
{
    int n = 0;
#ifdef __linux__
    for (int size = 1024; size <= 1 << 16 && n == 0; size *= 4) {
        cpu_set_t *set = CPU_ALLOC((size_t)size);
        if (set == NULL)
            break;
        size_t bytes = CPU_ALLOC_SIZE((size_t)size);
        if (sched_getaffinity(0, bytes, set) == 0)
            n = CPU_COUNT_S(bytes, set);
        CPU_FREE(set);
    }
#endif
    if (n <= 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = online > 0 ? (int)online : 1;
    }
    int quota = oi_cgroup_cpu_limit("/proc/self/cgroup", "/sys/fs/cgroup");
    if (quota > 0 && quota < n)
        n = quota;
    return n > 0 ? n : 1;
}
