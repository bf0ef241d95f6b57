/* How many CPUs the process may actually use, for sizing thread pools: a container or
 * `taskset` allows fewer than the machine has online. */
#ifndef OI_CORE_CPUS_H
#define OI_CORE_CPUS_H

/* The CPUs in the calling thread's affinity mask (sched_getaffinity; the online count where
 * there is none), capped by the cgroup CPU quota rounded up. At least 1. */
int oi_usable_cpus(void);

/* The cgroup CPU quota as a CPU count, rounded up, for the process whose /proc/PID/cgroup
 * text is in the file `proc_cgroup`, with the cgroup file systems mounted under `root`
 * (normally "/proc/self/cgroup" and "/sys/fs/cgroup"; tests pass fake ones). cgroup v2 reads
 * cpu.max ("max 100000", "150000 100000"); v1, when the file names a "cpu" controller, reads
 * cpu.cfs_quota_us and cpu.cfs_period_us under root/cpu or root/cpu,cpuacct. Every cgroup
 * from the process's own up to the mount's root counts (a parent's quota binds its children;
 * inside a container the mount's root is the container's cgroup), and the smallest wins.
 * Returns 0 when no quota is set or nothing can be read. */
int oi_cgroup_cpu_limit(const char *proc_cgroup, const char *root);

#endif
