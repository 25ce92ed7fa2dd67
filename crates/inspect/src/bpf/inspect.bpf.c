// SPDX-License-Identifier: GPL-2.0
/* The inspector's kernel half: report what the processes of watched cgroups do
 * to files and processes, so user space can compute a turn's net effects.
 *
 * Hooks, and why these (see docs/inspector.md):
 *  - tp_btf/sys_exit: one program for every file-mutating syscall. At exit the
 *    result is known (a failed unlink changed nothing), the syscall's arguments
 *    are still in the saved user registers, and a user string the kernel has just
 *    copied is in memory, so reading it rarely fails (at sys_enter, ~0.2% do).
 *  - tp_btf/sched_process_{fork,exec,exit}: process lifecycle.
 *  - iter/task: a snapshot of the watched tasks at each turn boundary, for the
 *    processes alive at the boundary and the CPU time each one used.
 * fentry/fexit and BPF-LSM programs would see VFS calls directly, but this kernel
 * refuses them (EPERM).
 *
 * Everything is attributed by cgroup: a task belongs to a session when its
 * unified-hierarchy cgroup, or that cgroup's ancestor at the sessions' level, is
 * in the `sessions` map. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "inspect.h"

char LICENSE[] SEC("license") = "GPL";

/* x86_64 syscall numbers: vmlinux.h has no unistd table. build.rs refuses
 * other architectures. */
#define NR_write 1
#define NR_open 2
#define NR_mmap 9
#define NR_ioctl 16
#define NR_pwrite64 18
#define NR_writev 20
#define NR_sendfile 40
#define NR_truncate 76
#define NR_ftruncate 77
#define NR_rename 82
#define NR_mkdir 83
#define NR_rmdir 84
#define NR_creat 85
#define NR_link 86
#define NR_unlink 87
#define NR_symlink 88
#define NR_chmod 90
#define NR_fchmod 91
#define NR_chown 92
#define NR_fchown 93
#define NR_lchown 94
#define NR_shmget 29
#define NR_shmat 30
#define NR_shmctl 31
#define NR_semget 64
#define NR_semop 65
#define NR_semctl 66
#define NR_msgget 68
#define NR_msgsnd 69
#define NR_msgctl 71
#define NR_ptrace 101
#define NR_utime 132
#define NR_mknod 133
#define NR_pivot_root 155
#define NR_mount 165
#define NR_umount2 166
#define NR_setxattr 188
#define NR_lsetxattr 189
#define NR_fsetxattr 190
#define NR_removexattr 197
#define NR_lremovexattr 198
#define NR_fremovexattr 199
#define NR_utimes 235
#define NR_openat 257
#define NR_mkdirat 258
#define NR_mknodat 259
#define NR_fchownat 260
#define NR_futimesat 261
#define NR_unlinkat 263
#define NR_renameat 264
#define NR_linkat 265
#define NR_symlinkat 266
#define NR_fchmodat 268
#define NR_splice 275
#define NR_utimensat 280
#define NR_semtimedop 220
#define NR_mq_open 240
#define NR_mq_unlink 241
#define NR_mq_timedsend 242
#define NR_fallocate 285
#define NR_pwritev 296
#define NR_open_by_handle_at 304
#define NR_process_vm_writev 311
#define NR_renameat2 316
#define NR_copy_file_range 326
#define NR_pwritev2 328
#define NR_io_uring_setup 425
#define NR_io_uring_enter 426
#define NR_io_uring_register 427
#define NR_move_mount 429
#define NR_fsmount 432
#define NR_openat2 437
#define NR_mount_setattr 442
#define NR_fchmodat2 452
#define NR_setxattrat 463
#define NR_removexattrat 466

#define AT_FDCWD -100
#define AT_REMOVEDIR 0x200
#define O_ACCMODE 03
#define O_CREAT 0100
#define O_TRUNC 01000
#define O_WRONLY 01
#define O_RDWR 02
#define MAP_SHARED 0x01
#define S_IFMT 00170000
#define S_IFREG 0100000
#define S_IFDIR 0040000
#define FMODE_WRITE 0x2
/* include/linux/fs.h; unchanged since 4.19, including the 6.9 renumbering. */
#define FMODE_CREATED 0x100000

/* A path component read from a dentry: NAME_MAX plus its NUL. */
#define NAME_LEN 256
/* A user-supplied path: longer ones are reported truncated. */
#define USER_LEN 1024
#define MAX_DEPTH 40
/* Where strings start is kept below DATA_HALF, so any one string fits. */
#define DATA_HALF 4096
#define DATA_SIZE (2 * DATA_HALF)

const volatile unsigned int session_level = 2;

struct session_val {
	unsigned long long epoch; /* bumped by user space at each turn boundary */
	/* Set while CRIU resumes the session after a dump: every process that
	 * returns from a syscall then goes into `returned`. */
	unsigned long long resuming;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, unsigned long long);
	__type(value, struct session_val);
} sessions SEC(".maps");

/* Processes (tgids) that returned to user space while their session was
 * resuming from a dump: they may have run code of their own since. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, unsigned int);
	__type(value, unsigned char);
} returned SEC(".maps");

/* Events the ring buffer had no room for, per watched cgroup. Apart from
 * `sessions` because user space rewrites those values. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, unsigned long long);
	__type(value, unsigned long long);
} lost SEC(".maps");

/* Never used: they put the record layouts into the skeleton's types, so the
 * Rust decoder reads exactly what the programs write. */
struct event_hdr unused_event_hdr = {};
struct task_rec unused_task_rec = {};

/* Files already reported as written in the current epoch: a write loop costs
 * one event per file and turn, not one per write. */
/* The inode's address alone could be reused within an epoch by a file that
 * existed before it; with its number and super block it cannot. */
struct written_key {
	unsigned long long cgroup;
	unsigned long long inode;
	unsigned long long ino;
	unsigned long long sb;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct written_key);
	__type(value, unsigned long long);
} written SEC(".maps");

#define RING_SIZE (16 << 20)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RING_SIZE);
} events SEC(".maps");

struct scratch {
	struct event_hdr h;
	char data[DATA_SIZE];
	/* The file this CPU last reported, and in which epoch: a write right
	 * after its open (the common case) then needs no hash-map access. */
	struct written_key last;
	unsigned long long last_epoch;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, unsigned int);
	__type(value, struct scratch);
} scratch SEC(".maps");

/* The watched session of the current task: its cgroup id and map value. */
static __always_inline struct session_val *current_session(unsigned long long *cg)
{
	unsigned long long id = bpf_get_current_cgroup_id();
	struct session_val *v = bpf_map_lookup_elem(&sessions, &id);
	if (!v) {
		id = bpf_get_current_ancestor_cgroup_id(session_level);
		v = bpf_map_lookup_elem(&sessions, &id);
	}
	if (v)
		*cg = id;
	return v;
}

static __always_inline struct scratch *begin(unsigned short op, unsigned long long cg,
					     struct session_val *v, long ret)
{
	unsigned int zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch, &zero);
	if (!s)
		return 0;
	unsigned long long pid_tgid = bpf_get_current_pid_tgid();
	s->h.version = EVENT_VERSION;
	s->h.op = op;
	s->h.flags = 0;
	s->h.cgroup = cg;
	s->h.epoch = v->epoch;
	s->h.pid = (unsigned int)pid_tgid;
	s->h.tgid = pid_tgid >> 32;
	s->h.ppid = 0;
	s->h.ret = (int)ret;
	s->h.lens[0] = s->h.lens[1] = s->h.lens[2] = s->h.lens[3] = 0;
	bpf_get_current_comm(&s->h.comm, sizeof(s->h.comm));
	return s;
}

static __always_inline void submit(struct scratch *s, unsigned int off)
{
	unsigned long long size = sizeof(struct event_hdr) + (off & (DATA_SIZE - 1));
	if (size > sizeof(struct scratch))
		size = sizeof(struct scratch);
	/* No wake-up per event: on a busy turn that would cost the workload a
	 * context switch per syscall. User space drains on a timer and at every
	 * turn end; only a filling ring wakes it early. */
	unsigned long long flags = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > RING_SIZE / 4
					   ? BPF_RB_FORCE_WAKEUP
					   : BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_output(&events, s, size, flags)) {
		unsigned long long *n = bpf_map_lookup_elem(&lost, &s->h.cgroup);
		if (n)
			__sync_fetch_and_add(n, 1);
	}
}

/* Append a user string as field `field`; returns the new offset. */
static __always_inline unsigned int put_user_str(struct scratch *s, unsigned int off, int field,
						 const char *p)
{
	if (off >= DATA_HALF) {
		s->h.flags |= F_TRUNCATED;
		return off;
	}
	long n = bpf_probe_read_user_str(&s->data[off & (DATA_HALF - 1)], USER_LEN, p);
	if (n <= 0) {
		s->h.flags |= F_UNREADABLE;
		s->data[off & (DATA_HALF - 1)] = 0;
		n = 1;
	} else if (n == USER_LEN) {
		s->h.flags |= F_TRUNCATED;
	}
	s->h.lens[field & 3] = n;
	return off + n;
}

static __always_inline unsigned int put_kernel_str(struct scratch *s, unsigned int off, int field,
						   const void *p)
{
	if (off >= DATA_HALF) {
		s->h.flags |= F_TRUNCATED;
		return off;
	}
	long n = bpf_probe_read_kernel_str(&s->data[off & (DATA_HALF - 1)], USER_LEN, p);
	if (n <= 0) {
		s->h.flags |= F_UNREADABLE;
		s->data[off & (DATA_HALF - 1)] = 0;
		n = 1;
	}
	s->h.lens[field & 3] = n;
	return off + n;
}

struct walk {
	struct scratch *s;
	unsigned int off;
	struct dentry *d;
	struct vfsmount *mnt;
	struct mount *m;
	struct dentry *mnt_root; /* of mnt: read once per mount, not per step */
	struct dentry *root_d;
	struct vfsmount *root_m;
	int done;
};

/* A dentry's parent and name pointer, read in one probe read when they sit
 * together (d_parent, then d_name's hash_len and name, as in every kernel
 * since 3.x); CO-RE gives the offsets, and a layout that differs costs two. */
struct dentry_head {
	struct dentry *parent;
	unsigned long long hash_len;
	const unsigned char *name;
};

static __always_inline void read_head(struct dentry *d, struct dentry_head *h)
{
	unsigned long po = bpf_core_field_offset(struct dentry, d_parent);
	unsigned long no = bpf_core_field_offset(struct dentry, d_name.name);
	if (no == po + 16) {
		bpf_probe_read_kernel(h, sizeof(*h), (void *)d + po);
	} else {
		h->parent = BPF_CORE_READ(d, d_parent);
		h->name = BPF_CORE_READ(d, d_name.name);
	}
}

/* One step of put_path's walk; a bpf_loop callback, so it is verified once.
 * Two helper calls a component: this runs for every path reported. */
static long walk_step(unsigned int i, struct walk *w)
{
	/* Locals, not w->...: BPF_CORE_READ on an expression through our own
	 * struct would ask for a relocation the kernel's BTF cannot satisfy. */
	struct scratch *s = w->s;
	struct dentry *d = w->d;
	struct mount *m = w->m;
	struct dentry_head h;

	if (d == w->root_d && w->mnt == w->root_m) {
		w->done = 1;
		return 1;
	}
	read_head(d, &h);
	if (d == w->mnt_root || d == h.parent) {
		struct mount *pm = BPF_CORE_READ(m, mnt_parent);
		if (pm == m) {
			w->done = 1; /* the top of the mount namespace */
			return 1;
		}
		w->d = BPF_CORE_READ(m, mnt_mountpoint);
		w->m = pm;
		w->mnt = &pm->mnt;
		w->mnt_root = BPF_CORE_READ(pm, mnt.mnt_root);
		return 0;
	}
	if (w->off >= DATA_HALF) {
		s->h.flags |= F_TRUNCATED;
		w->done = 1;
		return 1;
	}
	long n = bpf_probe_read_kernel_str(&s->data[w->off & (DATA_HALF - 1)], NAME_LEN, h.name);
	if (n <= 1) {
		s->h.flags |= F_UNREADABLE;
		w->done = 1;
		return 1;
	}
	w->off += n;
	w->d = h.parent;
	return 0;
}

/* Append the path of (dentry, mnt) as field `field`: its components from the
 * leaf up to the task's root, each NUL-terminated, then an empty one. Mount
 * points are crossed as d_path does; the walk stops at the task's root, so the
 * path is relative to the session's root. */
/* Global, not static: verified once on its own rather than again at every
 * call site, which kept sys_exit under the verifier's budget. */
__noinline unsigned int put_path(struct scratch *s, unsigned int off, int field, unsigned long d,
				 unsigned long mnt)
{
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();
	unsigned int start = off;
	/* Read with probe reads, so the walk's state holds plain numbers the
	 * verifier can prune on; typed pointers would make bpf_loop's callback
	 * too costly to verify. */
	struct walk w = {
		.s = s,
		.off = off,
		.d = (struct dentry *)d,
		.mnt = (struct vfsmount *)mnt,
		.m = (struct mount *)(mnt - bpf_core_field_offset(struct mount, mnt)),
		.mnt_root = BPF_CORE_READ((struct vfsmount *)mnt, mnt_root),
		.root_d = BPF_CORE_READ(t, fs, root.dentry),
		.root_m = BPF_CORE_READ(t, fs, root.mnt),
	};

	if (!s)
		return off;
	if (!d || !mnt)
		s->h.flags |= F_UNREADABLE;
	else
		bpf_loop(MAX_DEPTH, walk_step, &w, 0);
	if (!w.done)
		s->h.flags |= F_TRUNCATED;
	off = w.off;
	if (off >= DATA_HALF) {
		s->h.flags |= F_TRUNCATED;
		return off;
	}
	s->data[off & (DATA_HALF - 1)] = 0;
	off += 1;
	s->h.lens[field & 3] = off - start;
	return off;
}

/* The file behind an fd. Read through bpf_core_cast from here on: plain loads
 * the verifier guards, cheaper than a bpf_probe_read_kernel call each, on the
 * path every watched write takes. */
static __always_inline struct file *fd_file(int fd)
{
	struct task_struct *t = bpf_get_current_task_btf();
	struct fdtable *fdt = t->files->fdt;
	struct file *f = 0;

	if (fd < 0 || !fdt || (unsigned int)fd >= fdt->max_fds)
		return 0;
	bpf_probe_read_kernel(&f, sizeof(f), &fdt->fd[fd]);
	if (!f)
		return 0;
	return bpf_core_cast(f, struct file);
}

/* A file on a kernel-internal mount (a memfd, SysV or anonymous shared
 * memory, a pipe): no path of the session's file system, only memory of its
 * processes, which a process checkpoint captures. MNT_NS_INTERNAL is
 * ERR_PTR(-EINVAL). */
static __always_inline int on_internal_mount(struct file *f)
{
	unsigned long mnt = (unsigned long)f->f_path.mnt;
	struct mount *m = bpf_core_cast((void *)(mnt - bpf_core_field_offset(struct mount, mnt)),
					struct mount);
	long ns = (long)m->mnt_ns;
	return ns == 0 || ns == -22;
}

static __always_inline unsigned int file_type(struct file *f)
{
	return f->f_inode->i_mode & S_IFMT;
}

static __always_inline struct written_key file_key(unsigned long long cg, struct file *f)
{
	struct inode *i = f->f_inode;
	struct written_key k = {.cgroup = cg,
				.inode = (unsigned long long)i,
				.ino = i->i_ino,
				.sb = (unsigned long long)i->i_sb};
	return k;
}

static __always_inline struct scratch *this_cpu(void)
{
	unsigned int zero = 0;
	return bpf_map_lookup_elem(&scratch, &zero);
}

/* Note that f has been reported in `epoch`: in this CPU's cache only, the
 * cheap part. A miss later costs one more event, never a lost one. */
static __always_inline void remember(unsigned long long cg, struct file *f, unsigned long long epoch)
{
	struct scratch *s = this_cpu();
	if (s) {
		s->last = file_key(cg, f);
		s->last_epoch = epoch;
	}
}

/* Whether f was already reported in `epoch`; if not, it is about to be, so
 * note that. */
static __always_inline int reported(unsigned long long cg, struct file *f, unsigned long long epoch)
{
	struct written_key k = file_key(cg, f);
	struct scratch *s = this_cpu();
	if (s && s->last_epoch == epoch && s->last.inode == k.inode && s->last.ino == k.ino &&
	    s->last.sb == k.sb && s->last.cgroup == k.cgroup)
		return 1;
	unsigned long long *seen = bpf_map_lookup_elem(&written, &k);
	if (seen && *seen == epoch)
		return 1;
	bpf_map_update_elem(&written, &k, &epoch, BPF_ANY);
	if (s) {
		s->last = k;
		s->last_epoch = epoch;
	}
	return 0;
}

static __always_inline unsigned int put_file_path(struct scratch *s, unsigned int off, int field,
						  struct file *f)
{
	return put_path(s, off, field, (unsigned long)BPF_CORE_READ(f, f_path.dentry),
			(unsigned long)BPF_CORE_READ(f, f_path.mnt));
}

/* A path argument: the user string, then the directory it is relative to
 * (nothing for an absolute path). */
static __always_inline unsigned int put_at(struct scratch *s, unsigned int off, int field,
					   int dfd, const char *p)
{
	unsigned int name_off = off;
	char first = 0;

	if (!p) {
		/* utimensat(fd, NULL, ...): the fd itself. */
		s->h.lens[field & 3] = 1;
		if (off < DATA_HALF)
			s->data[off & (DATA_HALF - 1)] = 0;
		off += 1;
	} else {
		off = put_user_str(s, off, field, p);
	}
	if (name_off < DATA_HALF)
		first = s->data[name_off & (DATA_HALF - 1)];
	if (first == '/') {
		/* An absolute path needs no base: an empty field. */
		if (off < DATA_HALF)
			s->data[off & (DATA_HALF - 1)] = 0;
		s->h.lens[(field + 1) & 3] = 1;
		return off + 1;
	}
	if (dfd == AT_FDCWD) {
		struct task_struct *t = (struct task_struct *)bpf_get_current_task();
		return put_path(s, off, field + 1, (unsigned long)BPF_CORE_READ(t, fs, pwd.dentry),
				(unsigned long)BPF_CORE_READ(t, fs, pwd.mnt));
	}
	struct file *f = fd_file(dfd);
	if (!f) {
		s->h.flags |= F_UNREADABLE;
		return put_path(s, off, field + 1, 0, 0);
	}
	return put_file_path(s, off, field + 1, f);
}

/* How a syscall's effect is reported. */
enum shape { SH_NONE, SH_FD, SH_FD_ONCE, SH_AT, SH_AT2, SH_OPEN, SH_SIMPLE };

struct call {
	struct session_val *v;
	unsigned long long cg;
	long ret;
	unsigned short op;
	unsigned short shape;
	int fd;
	int dfd1, dfd2;
	const char *p1, *p2;
	unsigned long long flags; /* SH_OPEN: the open flags */
	unsigned int target;      /* SH_SIMPLE: a pid */
	const char *what;         /* SH_SIMPLE: a name */
};

/* One or two path arguments (two for rename and link), each relative to its
 * dfd. */
static __noinline int emit_at(struct call *c, int two)
{
	struct scratch *s = begin(c->op, c->cg, c->v, c->ret);
	if (!s)
		return 0;
	unsigned int off = put_at(s, 0, 0, c->dfd1, c->p1);
	if (two)
		off = put_at(s, off, 2, c->dfd2, c->p2);
	submit(s, off);
	return 0;
}

/* An operation on an open file: its path. `once` reports each file once per
 * epoch (writes); metadata changes are rare and always reported. */
static __noinline int emit_fd(struct call *c, int once)
{
	struct session_val *v = c->v;
	struct file *f = fd_file(c->fd);
	if (!f)
		return 0;
	if (c->op == EV_MMAP_SHARED && !(f->f_mode & FMODE_WRITE))
		return 0;
	unsigned int type = file_type(f);
	if (type != S_IFREG && !(type == S_IFDIR && !once))
		return 0; /* pipes, sockets, ttys, devices: not file-system state */
	if (on_internal_mount(f))
		return 0;
	if (once && reported(c->cg, f, v->epoch))
		return 0;
	struct scratch *s = begin(c->op, c->cg, v, c->ret);
	if (!s)
		return 0;
	if (type == S_IFDIR)
		s->h.flags |= F_DIR;
	/* name1 empty, base1 the file's own path. */
	s->data[0] = 0;
	s->h.lens[0] = 1;
	unsigned int off = put_file_path(s, 1, 1, f);
	submit(s, off);
	return 0;
}

static __noinline int emit_open(struct call *c)
{
	struct session_val *v = c->v;
	unsigned long long flags = c->flags;
	if ((flags & O_ACCMODE) == 0 && !(flags & (O_CREAT | O_TRUNC)))
		return 0; /* read-only */
	struct file *f = fd_file(c->ret);
	if (!f || file_type(f) != S_IFREG || on_internal_mount(f))
		return 0; /* /dev/null and friends */
	unsigned int fmode = f->f_mode;
	/* A created file is always reported: whether it still exists at the
	 * boundary decides if it is an effect. */
	if (fmode & FMODE_CREATED)
		remember(c->cg, f, v->epoch);
	else if (reported(c->cg, f, v->epoch))
		return 0;
	struct scratch *s = begin(EV_OPEN_WRITE, c->cg, v, c->ret);
	if (!s)
		return 0;
	if (fmode & FMODE_CREATED)
		s->h.flags |= F_CREATED;
	s->data[0] = 0;
	s->h.lens[0] = 1;
	unsigned int off = put_file_path(s, 1, 1, f);
	submit(s, off);
	return 0;
}

static __noinline int emit_simple(struct call *c)
{
	struct scratch *s = begin(c->op, c->cg, c->v, c->ret);
	if (!s)
		return 0;
	s->h.ppid = c->target;
	unsigned int off = put_kernel_str(s, 0, 0, c->what);
	submit(s, off);
	return 0;
}

static const char io_uring_name[] = "io_uring";
static const char mount_name[] = "mount";
static const char memwrite_name[] = "memwrite";
static const char ipc_name[] = "ipc";

#define FD(o, f) (c->op = (o), c->shape = SH_FD, c->fd = (f))
#define FD_ONCE(o, f) (c->op = (o), c->shape = SH_FD_ONCE, c->fd = (f))
#define AT(o, d, p) (c->op = (o), c->shape = SH_AT, c->dfd1 = (d), c->p1 = (const char *)(p))
#define AT2(o, d1, p1_, d2, p2_)                                                                   \
	(c->op = (o), c->shape = SH_AT2, c->dfd1 = (d1), c->p1 = (const char *)(p1_),            \
	 c->dfd2 = (d2), c->p2 = (const char *)(p2_))
#define OPEN(f) (c->op = EV_OPEN_WRITE, c->shape = SH_OPEN, c->flags = (f))
#define SIMPLE(o, t, w) (c->op = (o), c->shape = SH_SIMPLE, c->target = (t), c->what = (w))

/* Which syscalls change files or other processes, and where their arguments
 * are. Write-like calls that wrote nothing changed nothing. */
static __always_inline void describe(long id, struct pt_regs *regs, long ret, struct call *c)
{
	/* The syscall's arguments, as the entry code saved them. */
	unsigned long a0 = regs->di, a1 = regs->si, a2 = regs->dx, a3 = regs->r10;

	switch (id) {
	case NR_write:
	case NR_pwrite64:
	case NR_writev:
	case NR_pwritev:
	case NR_pwritev2:
	case NR_sendfile:
		if (ret > 0)
			FD_ONCE(EV_WRITE, a0);
		break;
	case NR_fallocate:
		FD_ONCE(EV_WRITE, a0);
		break;
	case NR_splice:
	case NR_copy_file_range:
		if (ret > 0)
			FD_ONCE(EV_WRITE, a2);
		break;
	case NR_ftruncate:
		FD(EV_TRUNCATE, a0);
		break;
	case NR_fchmod:
		FD(EV_CHMOD, a0);
		break;
	case NR_fchown:
		FD(EV_CHOWN, a0);
		break;
	case NR_fsetxattr:
	case NR_fremovexattr:
		FD(EV_XATTR, a0);
		break;
	case NR_ioctl:
		/* chattr, reflinks and dedupe: FS_IOC_SETFLAGS, FS_IOC_FSSETXATTR,
		 * FICLONE, FICLONERANGE, FIDEDUPERANGE. */
		if ((unsigned int)a1 == 0x40086602 || (unsigned int)a1 == 0x401c5820 ||
		    (unsigned int)a1 == 0x40049409 || (unsigned int)a1 == 0x4020940d ||
		    (unsigned int)a1 == 0xc0189436)
			FD(EV_IOCTL, a0);
		break;
	case NR_mmap:
		/* A shared mapping of a file open for writing: writable later
		 * through mprotect even if mapped read-only now. */
		if (regs->r10 & MAP_SHARED)
			FD(EV_MMAP_SHARED, regs->r8);
		break;
	case NR_open:
		OPEN(a1);
		break;
	case NR_creat:
		OPEN(O_CREAT | O_WRONLY | O_TRUNC);
		break;
	case NR_openat:
	case NR_open_by_handle_at:
		OPEN(a2);
		break;
	case NR_openat2: {
		unsigned long long flags = O_RDWR; /* unreadable: assume writable */
		bpf_probe_read_user(&flags, sizeof(flags), (void *)a2);
		OPEN(flags);
		break;
	}
	case NR_truncate:
		AT(EV_TRUNCATE, AT_FDCWD, a0);
		break;
	case NR_rename:
		AT2(EV_RENAME, AT_FDCWD, a0, AT_FDCWD, a1);
		break;
	case NR_renameat:
	case NR_renameat2:
		AT2(EV_RENAME, a0, a1, a2, a3);
		break;
	case NR_link:
		AT2(EV_LINK, AT_FDCWD, a0, AT_FDCWD, a1);
		break;
	case NR_linkat:
		AT2(EV_LINK, a0, a1, a2, a3);
		break;
	case NR_unlink:
		AT(EV_UNLINK, AT_FDCWD, a0);
		break;
	case NR_unlinkat:
		AT(a2 & AT_REMOVEDIR ? EV_RMDIR : EV_UNLINK, a0, a1);
		break;
	case NR_rmdir:
		AT(EV_RMDIR, AT_FDCWD, a0);
		break;
	case NR_mkdir:
		AT(EV_MKDIR, AT_FDCWD, a0);
		break;
	case NR_mkdirat:
		AT(EV_MKDIR, a0, a1);
		break;
	case NR_mknod:
		AT(EV_MKNOD, AT_FDCWD, a0);
		break;
	case NR_mknodat:
		AT(EV_MKNOD, a0, a1);
		break;
	case NR_symlink:
		AT(EV_SYMLINK, AT_FDCWD, a1);
		break;
	case NR_symlinkat:
		AT(EV_SYMLINK, a1, a2);
		break;
	case NR_chmod:
		AT(EV_CHMOD, AT_FDCWD, a0);
		break;
	case NR_fchmodat:
	case NR_fchmodat2:
		AT(EV_CHMOD, a0, a1);
		break;
	case NR_chown:
	case NR_lchown:
		AT(EV_CHOWN, AT_FDCWD, a0);
		break;
	case NR_fchownat:
		AT(EV_CHOWN, a0, a1);
		break;
	case NR_setxattr:
	case NR_lsetxattr:
	case NR_removexattr:
	case NR_lremovexattr:
		AT(EV_XATTR, AT_FDCWD, a0);
		break;
	case NR_setxattrat:
	case NR_removexattrat:
		AT(EV_XATTR, a0, a1);
		break;
	case NR_utime:
	case NR_utimes:
		AT(EV_UTIMES, AT_FDCWD, a0);
		break;
	case NR_futimesat:
	case NR_utimensat:
		AT(EV_UTIMES, a0, a1);
		break;
	case NR_io_uring_setup:
	case NR_io_uring_enter:
	case NR_io_uring_register:
		SIMPLE(EV_OPAQUE, 0, io_uring_name);
		break;
	case NR_mount:
	case NR_umount2:
	case NR_move_mount:
	case NR_fsmount:
	case NR_mount_setattr:
	case NR_pivot_root:
		SIMPLE(EV_OPAQUE, 0, mount_name);
		break;
	case NR_shmget:
	case NR_shmat:
	case NR_shmctl:
	case NR_semget:
	case NR_semop:
	case NR_semctl:
	case NR_semtimedop:
	case NR_msgget:
	case NR_msgsnd:
	case NR_msgctl:
	case NR_mq_open:
	case NR_mq_unlink:
	case NR_mq_timedsend:
		SIMPLE(EV_IPC, 0, ipc_name);
		break;
	case NR_process_vm_writev:
		if (ret > 0)
			SIMPLE(EV_MEMWRITE, a0, memwrite_name);
		break;
	case NR_ptrace:
		/* PTRACE_POKETEXT/POKEDATA/POKEUSER, SETREGS, SETFPREGS, SETREGSET. */
		if (a0 == 4 || a0 == 5 || a0 == 6 || a0 == 13 || a0 == 15 || a0 == 0x4205)
			SIMPLE(EV_MEMWRITE, a1, memwrite_name);
		break;
	}
}

/* A subprogram, so that its branch does not double what the verifier walks
 * in the caller. The kernel's own restart codes (ERESTARTSYS ..
 * ERESTART_RESTARTBLOCK, 512-516) are no return to the process's code: a
 * sleeping syscall ends with one when the freezer stops its task, and runs
 * again after the thaw. A signal handler that runs instead is seen by
 * signal_deliver below. */
static __noinline void note_return(struct session_val *v, long ret)
{
	if (ret <= -512 && ret >= -516)
		return;
	if (v->resuming) {
		unsigned int tgid = bpf_get_current_pid_tgid() >> 32;
		unsigned char one = 1;
		bpf_map_update_elem(&returned, &tgid, &one, BPF_ANY);
	}
}

SEC("tp_btf/sys_exit")
int BPF_PROG(sys_exit, struct pt_regs *regs, long ret)
{
	unsigned long long cg;
	struct session_val *v = current_session(&cg);
	struct call c = {};

	if (!v)
		return 0;
	note_return(v, ret);
	if (ret < 0)
		return 0;
	c.v = v;
	c.cg = cg;
	c.ret = ret;
	describe(regs->orig_ax, regs, ret, &c);
	switch (c.shape) {
	case SH_FD:
		return emit_fd(&c, 0);
	case SH_FD_ONCE:
		return emit_fd(&c, 1);
	case SH_AT:
		return emit_at(&c, 0);
	case SH_AT2:
		return emit_at(&c, 1);
	case SH_OPEN:
		return emit_open(&c);
	case SH_SIMPLE:
		return emit_simple(&c);
	}
	return 0;
}

/* A signal handed to a handler of the process's own while its session
 * resumes: the process ran code of its own, even if its syscall restarts
 * (see note_return). */
SEC("tp_btf/signal_deliver")
int BPF_PROG(signal_deliver, int sig, struct kernel_siginfo *info, struct k_sigaction *ka)
{
	unsigned long long cg;
	struct session_val *v = current_session(&cg);

	if (v)
		note_return(v, 0);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(process_fork, struct task_struct *parent, struct task_struct *child)
{
	unsigned long long cg;
	struct session_val *v = current_session(&cg);
	if (!v)
		return 0;
	struct scratch *s = begin(EV_FORK, cg, v, 0);
	if (!s)
		return 0;
	s->h.pid = child->pid;
	s->h.tgid = child->tgid;
	s->h.ppid = parent->tgid;
	if (child->tgid == parent->tgid)
		s->h.flags |= F_THREAD;
	submit(s, 0);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(process_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	unsigned long long cg;
	struct session_val *v = current_session(&cg);
	if (!v)
		return 0;
	struct scratch *s = begin(EV_EXEC, cg, v, 0);
	if (!s)
		return 0;
	unsigned int off = put_kernel_str(s, 0, 0, BPF_CORE_READ(bprm, filename));
	submit(s, off);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(process_exit, struct task_struct *p)
{
	unsigned long long cg;
	struct session_val *v = current_session(&cg);
	if (!v)
		return 0;
	/* Only the end of a whole process matters, not of one of its threads. */
	if (BPF_CORE_READ(p, signal, live.counter) != 0)
		return 0;
	struct scratch *s = begin(EV_EXIT, cg, v, BPF_CORE_READ(p, exit_code));
	if (!s)
		return 0;
	s->h.flags |= F_GROUP_DEAD;
	submit(s, 0);
	return 0;
}

/* The session cgroup a task belongs to, or 0. */
static __always_inline unsigned long long task_session(struct task_struct *t)
{
	struct cgroup *c = BPF_CORE_READ(t, cgroups, dfl_cgrp);
	unsigned long long id;

	if (!c)
		return 0;
	id = BPF_CORE_READ(c, kn, id);
	if (bpf_map_lookup_elem(&sessions, &id))
		return id;
	if (BPF_CORE_READ(c, level) <= (int)session_level)
		return 0;
	struct cgroup *anc = 0;
	bpf_core_read(&anc, sizeof(anc), &c->ancestors[session_level & 15]);
	if (!anc)
		return 0;
	id = BPF_CORE_READ(anc, kn, id);
	return bpf_map_lookup_elem(&sessions, &id) ? id : 0;
}

/* The open-coded iterator over a css's tasks (kernel 6.7 and later). */
extern int bpf_iter_css_task_new(struct bpf_iter_css_task *it,
				 struct cgroup_subsys_state *css, unsigned int flags) __weak __ksym;
extern struct task_struct *bpf_iter_css_task_next(struct bpf_iter_css_task *it) __weak __ksym;
extern void bpf_iter_css_task_destroy(struct bpf_iter_css_task *it) __weak __ksym;

static __always_inline void dump_task(struct seq_file *seq, struct task_struct *t)
{
	struct task_rec r = {};

	/* A zombie has exited: nothing of it is left to recover. */
	if (t->exit_state)
		return;
	r.cgroup = task_session(t);
	if (!r.cgroup)
		return;
	r.pid = t->pid;
	r.tgid = t->tgid;
	r.ppid = BPF_CORE_READ(t, real_parent, tgid);
	r.start_time = BPF_CORE_READ(t, group_leader, start_time);
	struct pid *tp = BPF_CORE_READ(t, group_leader, thread_pid);
	unsigned int lvl = BPF_CORE_READ(tp, level);
	bpf_core_read(&r.ns_tgid, sizeof(r.ns_tgid), &tp->numbers[lvl & 7].nr);
	r.runtime_ns = t->se.sum_exec_runtime;
	r.switches = t->nvcsw + t->nivcsw;
	r.faults = t->min_flt + t->maj_flt;
	__builtin_memcpy(r.comm, t->comm, sizeof(r.comm));
	bpf_seq_write(seq, &r, sizeof(r));
}

/* One record per task of one session. The link names the session's cgroup
 * and walks it and every cgroup below it, in pre-order: this is called once
 * for each, and writes the tasks that cgroup holds itself (with threads).
 * What it costs follows the session's size, not the host's, as a task
 * iterator over every task on the host did (one walk per turn end, under
 * the inspector's lock, whichever session ended it). */
SEC("iter/cgroup")
int dump_session_tasks(struct bpf_iter__cgroup *ctx)
{
	struct seq_file *seq = ctx->meta->seq;
	struct cgroup *cgrp = ctx->cgroup;
	struct task_struct *t;

	/* Called once more after the last cgroup, with none. */
	if (!cgrp)
		return 0;
	bpf_for_each(css_task, t, &cgrp->self, 0)
		dump_task(seq, t);
	return 0;
}
