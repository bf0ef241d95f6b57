/* A hook for tests/test_cpus.py: with two arguments, prints what oi_cgroup_cpu_limit finds for
 * a /proc/PID/cgroup file and a cgroup mount root (fake ones in the tests); without, prints
 * oi_usable_cpus() for this process. */
#include "core/cpus.h"

#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc == 3)
        printf("%d\n", oi_cgroup_cpu_limit(argv[1], argv[2]));
    else
        printf("%d\n", oi_usable_cpus());
    return 0;
}
