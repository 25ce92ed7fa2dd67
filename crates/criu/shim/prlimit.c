/*
 * drums-criu-prlimit: lets CRIU read the resource limits of a process that
 * runs as another user, on hosts where root lacks CAP_SYS_RESOURCE.
 *
 * CRIU's dump reads every task's limits with prlimit64(pid, res, NULL, &old).
 * The kernel allows that across users only with CAP_SYS_RESOURCE, which some
 * hosts (this project's CI among them) withhold even from root, so a session
 * with one non-root process (a desktop's `user`) cannot be checkpointed.
 * /proc/PID/limits carries the same numbers and is readable without that
 * capability. This library, preloaded into `criu swrk` by drums, answers such
 * a read from there when, and only when, the kernel said EPERM. Every other
 * system call, and every prlimit64 that sets a limit, goes to the kernel
 * unchanged.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

struct limit64 {
	uint64_t cur;
	uint64_t max;
};

/* /proc/PID/limits lists the limits in resource order, after one header. */
static int read_proc_limits(long pid, long res, struct limit64 *out)
{
	char path[64], line[256];
	FILE *f;
	long n = -1;
	int found = -1;

	if (res < 0 || res > 63)
		return -1;
	snprintf(path, sizeof(path), "/proc/%ld/limits", pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		char soft[32], hard[32];

		if (n++ != res)
			continue;
		/* "Max open files            1024                 1048576              files" */
		if (strlen(line) < 26 || sscanf(line + 26, "%31s %31s", soft, hard) != 2)
			break;
		out->cur = strcmp(soft, "unlimited") ? strtoull(soft, NULL, 10) : UINT64_MAX;
		out->max = strcmp(hard, "unlimited") ? strtoull(hard, NULL, 10) : UINT64_MAX;
		found = 0;
		break;
	}
	fclose(f);
	return found;
}

long syscall(long nr, ...)
{
	static long (*real)(long, ...);
	long a[6];
	va_list ap;
	long r;
	int i;

	va_start(ap, nr);
	for (i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	if (!real)
		real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
	r = real(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
	if (r == -1 && errno == EPERM && nr == SYS_prlimit64 && a[0] > 0 && a[2] == 0 && a[3] != 0) {
		if (read_proc_limits(a[0], a[1], (struct limit64 *)a[3]) == 0)
			return 0;
		errno = EPERM;
	}
	return r;
}
